"""Small MCP servers written with the SDK's server API, run as real processes by the MCP tests."""
