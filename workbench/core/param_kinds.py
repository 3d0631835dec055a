"""The kind of a parameter from its path: embedding, attention, mlp, expert, norm or other.

Domain knowledge the figures colour by and the studies group by (a routed expert, a norm); pure.
"""

from __future__ import annotations

import functools
import re

#: The kinds, in the order figures draw them.
PARAM_KINDS = ("embedding", "attention", "mlp", "expert", "norm", "other")

_KIND_RULES = (
    ("expert", re.compile(r"(^|\.)experts?\.")),
    ("norm", re.compile(r"norm|(^|\.)ln_")),
    ("embedding", re.compile(r"embed|(^|\.)(wte|wpe)\.|lm_head")),
    ("attention", re.compile(r"attn|attention|(^|\.)[qkvo]_proj\.|(^|\.)w[qkvo]\.")),
    ("mlp", re.compile(r"mlp|feed_forward|ffn|moe|(^|\.)(gate|up|down)_proj\.|(^|\.)(w[123]|c_fc|c_proj)\.")),
)


@functools.lru_cache(maxsize=1 << 16)
def param_kind(path: str) -> str:
    """The kind of a parameter from its path: embedding, attention, mlp, expert, norm or other.

    Routed experts win over everything (``...experts.3.w1.weight`` is ``"expert"``);
    norms win over their block (``self_attn.q_norm.weight`` is ``"norm"``).
    """
    lowered = path.lower()
    for kind, pattern in _KIND_RULES:
        if pattern.search(lowered):
            return kind
    return "other"
