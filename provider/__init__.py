"""Paperclip sandbox-provider plugin for CreateOS: the worker, its CreateOS client and the local emulator."""
