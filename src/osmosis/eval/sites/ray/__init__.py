"""The Ray site: rollout servers as Ray actors on a cluster's nodes.

- `site`: the `Site` a host starts (the only module that imports `ray`, and only when started).
- `actor`: the actor that runs one rollout server on its node and relays the protocol.
- `ship`: the checkout sent to each node and the trial files sent back.
"""
