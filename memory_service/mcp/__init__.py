"""The memory tools over the Model Context Protocol (stdio or streamable HTTP)."""
