"""What a model call costs, from LiteLLM's bundled price map, without importing LiteLLM.

LiteLLM ships its price table as a JSON file inside the package. Importing LiteLLM costs
seconds and ~200 MB, and `litellm.cost_per_token` costs CPU on every call, so the bridge reads
that file once (~75 ms) and multiplies. Unknown models, and machines without LiteLLM, have no
price: their cost is `None`, never a made-up zero.

    price = price_for("openai/gpt-4o-mini")
    price.cost(prompt_tokens=1000, completion_tokens=1000)  # 0.00075
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

__all__ = ["Price", "load_price_map", "price_for"]

_PRICE_FILE = "model_prices_and_context_window_backup.json"
_lock = threading.Lock()


@dataclass(frozen=True)
class Price:
    """USD per token for one model.

    Price(input_per_token=1.5e-7, output_per_token=6e-7).cost(prompt_tokens=10, completion_tokens=2)
    """

    input_per_token: float
    output_per_token: float
    cached_input_per_token: float | None = None
    """What a prompt token read from the provider's cache costs, where the provider says."""

    def cost(self, *, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float:
        """The USD cost of one call; `cached_tokens` are the part of `prompt_tokens` served
        from the provider's prompt cache (billed at the cached rate when one is known)."""
        cached = min(max(cached_tokens, 0), prompt_tokens)
        cached_rate = self.cached_input_per_token
        if cached_rate is None:
            cached, cached_rate = 0, 0.0
        return (
            (prompt_tokens - cached) * self.input_per_token
            + cached * cached_rate
            + completion_tokens * self.output_per_token
        )


def _price_file() -> Path | None:
    # find_spec locates the installed package without executing its (slow) __init__.
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / _PRICE_FILE
        if candidate.is_file():
            return candidate
    return None


@cache
def load_price_map() -> Mapping[str, Mapping[str, Any]]:
    """LiteLLM's bundled price map ({} without LiteLLM), read once per process."""
    path = _price_file()
    if path is None:
        return {}
    with path.open("rb") as handle:
        data = json.load(handle)
    return data if isinstance(data, dict) else {}


@cache
def _price_bytes() -> bytes | None:
    path = _price_file()
    return path.read_bytes() if path is not None else None


def _listed_entry(name: str) -> Any:
    """`name`'s entry in the price map (None when it lists none), as `load_price_map().get`
    gives it, found in the file's bytes (a few ms) rather than by parsing all 3.5 MB of it
    (~75 ms of CPU holding the GIL as a run starts, while its model pre-flight waits on the
    event loop). A name that is no key anywhere in the file is not listed; one that is a key
    once, on a line of its own at four spaces (LiteLLM writes the map with `indent=4`), is
    that entry. Anything else (a name JSON would escape, a key written elsewhere or twice)
    reads the whole map."""
    with _lock:  # the first caller reads the file; concurrent threads wait for it
        raw = _price_bytes()
    if raw is None:
        return None
    if name.isascii() and name.isprintable() and '"' not in name and "\\" not in name:
        keys = [m.start() for m in re.finditer(rb'"%s"\s*:' % re.escape(name.encode()), raw)]
        if not keys:
            return None
        head = b'\n    "' + name.encode() + b'": {'
        at = keys[0] - 5
        if len(keys) == 1 and raw.startswith(head, at):
            end = raw.find(b"\n    }", at)
            if end > at:
                with contextlib.suppress(ValueError):  # not one object after all
                    return json.loads(raw[at + len(head) - 1 : end + 6])
    with _lock:
        return load_price_map().get(name)


def _entry_price(entry: Mapping[str, Any]) -> Price | None:
    input_cost = entry.get("input_cost_per_token")
    output_cost = entry.get("output_cost_per_token")
    if not isinstance(input_cost, int | float) or not isinstance(output_cost, int | float):
        return None
    cached = entry.get("cache_read_input_token_cost")
    return Price(
        input_per_token=float(input_cost),
        output_per_token=float(output_cost),
        cached_input_per_token=float(cached) if isinstance(cached, int | float) else None,
    )


def _provider_matches(entry: Mapping[str, Any], provider: str) -> bool:
    # LiteLLM files some models under a variant of the provider the user names:
    # bedrock/... under "bedrock_converse", vertex_ai/... under "vertex_ai-anthropic_models".
    listed = entry.get("litellm_provider")
    return isinstance(listed, str) and listed.startswith(provider)


def price_for(
    model_path: str, prices: Mapping[str, Mapping[str, Any]] | None = None
) -> Price | None:
    """The price of `model_path` ("openai/gpt-4o-mini", "bedrock/anthropic.claude-…",
    "gpt-4o"), looked up the way LiteLLM does; None when the map does not list it.

        price_for("openai/gpt-4o-mini").output_per_token  # 6e-07
        price_for("hosted_vllm/my-model")  # None
    """
    get: Callable[[str], Any] = _listed_entry if prices is None else prices.get
    entry = get(model_path)
    if entry is not None:
        return _entry_price(entry)
    provider, slash, bare = model_path.partition("/")
    if not slash:
        return None
    # OpenAI and Anthropic models are listed by bare name with their provider alongside.
    entry = get(bare)
    if entry is not None and _provider_matches(entry, provider):
        return _entry_price(entry)
    return None
