"""Prices from LiteLLM's bundled map, read without importing LiteLLM."""

from __future__ import annotations

import re

import pytest

from osmosis.eval.model.pricing import Price, load_price_map, price_for

PRICES = {
    "gpt-4o-mini": {
        "litellm_provider": "openai",
        "input_cost_per_token": 1.5e-7,
        "output_cost_per_token": 6e-7,
        "cache_read_input_token_cost": 7.5e-8,
    },
    "anthropic.claude-x": {
        "litellm_provider": "bedrock_converse",
        "input_cost_per_token": 3e-6,
        "output_cost_per_token": 1.5e-5,
    },
    "groq/llama-3": {
        "litellm_provider": "groq",
        "input_cost_per_token": 5e-8,
        "output_cost_per_token": 8e-8,
    },
    "free-text-model": {"litellm_provider": "openai", "mode": "chat"},
}


@pytest.mark.parametrize(
    ("model_path", "expected"),
    [
        ("gpt-4o-mini", (1.5e-7, 6e-7)),
        ("openai/gpt-4o-mini", (1.5e-7, 6e-7)),
        ("bedrock/anthropic.claude-x", (3e-6, 1.5e-5)),
        ("groq/llama-3", (5e-8, 8e-8)),
        ("anthropic/gpt-4o-mini", None),  # listed, but under another provider
        ("hosted_vllm/gpt-4o-mini", None),
        ("openai/free-text-model", None),  # listed without prices
        ("unknown-model", None),
    ],
)
def test_price_lookup(model_path: str, expected: tuple[float, float] | None) -> None:
    price = price_for(model_path, PRICES)
    if expected is None:
        assert price is None
    else:
        assert price is not None
        assert (price.input_per_token, price.output_per_token) == expected


def test_cost_counts_cached_prompt_tokens_at_the_cached_rate() -> None:
    price = Price(input_per_token=1e-6, output_per_token=2e-6, cached_input_per_token=1e-7)
    assert price.cost(prompt_tokens=1000, completion_tokens=100) == pytest.approx(1.2e-3)
    assert price.cost(prompt_tokens=1000, completion_tokens=0, cached_tokens=400) == pytest.approx(
        600e-6 + 40e-6
    )
    uncached = Price(input_per_token=1e-6, output_per_token=0)
    assert uncached.cost(prompt_tokens=10, completion_tokens=0, cached_tokens=5) == pytest.approx(
        1e-5
    )


def test_the_bundled_map_is_read_from_the_installed_litellm() -> None:
    # LiteLLM is a dependency of osmosis: an empty map is a bug, not a reason to skip.
    assert load_price_map(), "LiteLLM's bundled price map could not be read"
    price = price_for("openai/gpt-4o-mini")
    assert price is not None and price.input_per_token > 0
    assert price_for("hosted_vllm/no-such-model") is None


@pytest.mark.slow
def test_costs_match_litellms_own_arithmetic() -> None:
    from osmosis.eval.model.provider_litellm import import_litellm

    litellm = import_litellm()
    for model in ("gpt-4o-mini", "claude-sonnet-4-5", "gpt-4.1"):
        price = price_for(model)
        assert price is not None, model
        prompt, completion = litellm.cost_per_token(
            model=model, prompt_tokens=1234, completion_tokens=567
        )
        assert price.cost(prompt_tokens=1234, completion_tokens=567) == pytest.approx(
            prompt + completion
        )


def test_a_price_found_in_the_files_bytes_is_the_one_the_whole_map_gives() -> None:
    # The bridge looks its model up without parsing the whole file (~75 ms of CPU at every
    # run's start); every answer must be the parsed map's. A sample of every listed model
    # (all of them take ~15 s), bare and under a provider the lookup matches bare names for,
    # names listed nowhere, and keys the file writes off its usual layout (at column 0).
    prices = load_price_map()
    listed = sorted(prices)
    irregular = [name.decode() for name in re.findall(rb'\n"([^"]+)":', _bundled_bytes())]
    names = [*listed[::97], *irregular, "fake-model", "my-model-7b", "gpt-4o-mini"]
    for name in names:
        for model_path in (name, f"openai/{name}", f"anthropic/{name}"):
            assert price_for(model_path) == price_for(model_path, prices), model_path


def _bundled_bytes() -> bytes:
    from osmosis.eval.model.pricing import _price_file

    path = _price_file()
    assert path is not None
    return path.read_bytes()
