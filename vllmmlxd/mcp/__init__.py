"""MCP clients inside a worker: the servers an entry names, their tools, and running them.

Each worker holds its own clients (``hub.McpHub``): its tools live and die with it, a call
needs no hop through the daemon, and a key's MCP scope is checked where the request is.
Nothing here is imported by the daemon or ``vllmmlxctl``; the SDK is imported on first connect.
"""
