"""Developer tools: the real-host peer client and the demo."""
