"""Test helpers users import: the scripted model and its step builders."""

from contextos.models.scripted import ScriptedModel, call_tool, call_tools, reply

__all__ = ["ScriptedModel", "call_tool", "call_tools", "reply"]
