"""Scripted fake model APIs (Anthropic, OpenAI Responses, Gemini) that real agents are
pointed at in tests: real HTTP servers on 127.0.0.1, see :mod:`tests.fake_models.base`."""

from tests.fake_models.anthropic import AnthropicFake
from tests.fake_models.base import FakeModel, Reply, Request, ToolCall, call, hang, say
from tests.fake_models.gemini import GeminiFake
from tests.fake_models.openai import OpenAIResponsesFake

__all__ = [
    "AnthropicFake",
    "FakeModel",
    "GeminiFake",
    "OpenAIResponsesFake",
    "Reply",
    "Request",
    "ToolCall",
    "call",
    "hang",
    "say",
]
