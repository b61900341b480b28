"""Paperclip sandbox-provider plugin for CreateOS: the worker, its HTTP client and an emulator."""
