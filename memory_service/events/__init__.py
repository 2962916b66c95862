"""Change events of an agent's memory (docs/events.md): the stream each agent's changes are
appended to (log.py), webhooks hosts register (webhooks.py), their signature (signing.py) and
the worker's delivery of the stream to them (delivery.py)."""
