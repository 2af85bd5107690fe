"""The model bridge and everything behind it: what a rollout's model calls go through.

- `bridge` (+ `bridge_http`, `bridge_calls`, `bridge_rules`, `bridge_outage`, `bridge_wire`,
  `bridge_budget`, `bridge_record`, `bridge_limits`): the per-run OpenAI-compatible endpoint
  that pins the model, counts and records every call, holds calls once the run's budget is
  spent, and keeps calls in flight under the provider key's adaptive limit.
- `providers` (+ `provider_openai`, `provider_litellm`): the registry of provider clients.
- `retry`, `pricing`, `preflight` (the checks before anything is dispatched), `local_model`.

Imports nothing of `osmosis.eval` outside this room but `errors`.
"""
