"""The ``data.synthetic:`` section: retrieval-dense synthetic sequences mixed into training (data/synthetic.py)."""

from __future__ import annotations

from pydantic import Field

from hybrid_lightning.config.fields import Number, Whole, _Frozen


class SyntheticConfig(_Frozen):
    """Retrieval-dense synthetic sequences mixed into training (see data/synthetic.py)."""

    fraction: Number = Field(0.5, ge=0, le=1, description="share of training sequences that are synthetic retrieval "
                            "sequences (0 = off)")
    value_chars: tuple[Whole, Whole] = Field((6, 24), description="min and max characters of a value")
    queries_per_fact: Number = Field(3.0, ge=0, description="how often facts are queried, relative to how often they "
                                     "are stated")
    repeat_template: Number = Field(0.5, ge=0, le=1, description="share of queries that restate a fact in the template "
                                   "it was stated in (the rest are questions)")
    repeat_spans: Number = Field(1.0, ge=0, description="weight of verbatim repeats of earlier spans (filler and facts "
                                 "weigh 1)")
