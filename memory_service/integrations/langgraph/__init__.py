"""The LangGraph / LangChain adapter (`pip install 'memory-service[langgraph]'`,
docs/integrations/langgraph.md): LangGraph's long-term store kept in the service
(``MemoryServiceStore``), the session loop as a LangChain 1.x agent middleware
(``MemoryMiddleware``) and the memory tools as LangChain tools (``memory_tools``)."""

from memory_service.integrations.langgraph.middleware import MemoryMiddleware, NotRecorded
from memory_service.integrations.langgraph.store import MemorySearchItem, MemoryServiceStore
from memory_service.integrations.langgraph.tools import memory_tools

__all__ = ["MemoryMiddleware", "MemorySearchItem", "MemoryServiceStore", "NotRecorded", "memory_tools"]
