"""Adapters that plug the service into agent frameworks, one module per framework.

Each imports only the public client (memory_service.client) and its framework, which comes
with an optional extra (`memory-service[langgraph]`, `[openai-agents]`, `[llamaindex]`,
`[pydantic-ai]`): the base install stays httpx and pydantic. Importing this package imports no
framework; import the module of the one you use. docs/integrations/ has a page for each.
"""
