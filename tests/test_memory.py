"""Activation checkpointing (``train.activation_checkpointing``) and the memory estimate of a run."""

import pytest
import torch

from hybrid_lightning.model import build_model, resolve_model_config
from hybrid_lightning.training.system import LMSystem

VOCAB = 50


def loss_and_grads(mixer: str, checkpointing: bool, doc_ids=None):
    torch.manual_seed(0)
    cfg = resolve_model_config({"n_layers": 4, "d_model": 32, "n_heads": 2, "pattern": "EEEF", "mixer": mixer,
                                "window": 16, "mamba2": {"head_dim": 16, "d_state": 8}}, vocab_size=VOCAB)
    model = build_model(cfg)
    model.activation_checkpointing = checkpointing
    tokens = torch.randint(0, VOCAB, (2, 97), generator=torch.Generator().manual_seed(1))
    logits = model(tokens[:, :-1], doc_ids=doc_ids)
    loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), tokens[:, 1:])
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()]


@pytest.mark.parametrize("mixer", ["swa", "mamba2", "gated_deltanet", "lightning"])
def test_activation_checkpointing_gives_the_same_loss_and_gradients(mixer):
    doc_ids = torch.tensor([[0] * 30 + [1] * 66, [0] * 96])
    for docs in (None, doc_ids):
        loss, grads = loss_and_grads(mixer, False, docs)
        loss_ckpt, grads_ckpt = loss_and_grads(mixer, True, docs)
        assert torch.equal(loss, loss_ckpt)  # the recomputed forward is the same computation
        assert all(torch.equal(a, b) for a, b in zip(grads, grads_ckpt))


def test_the_training_system_switches_checkpointing_on():
    raw = {"model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "pattern": "EF", "vocab_size": 257}}
    assert LMSystem(raw).model.activation_checkpointing is False
    assert LMSystem({**raw, "train": {"activation_checkpointing": True}}).model.activation_checkpointing is True
