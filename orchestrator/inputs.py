"""A generation's input, the same on every API: exactly one of a text prompt, chat messages or token
ids (docs/http-api.md). Chat roles are system, user, assistant and developer (OpenAI's newer name of
system); a message's content is text: a control token's string in it (`<|im_end|>`) is tokenized as
text, so no content can open or close a turn of the chat template (transformers'
apply_chat_template(sanitize_control_tokens=True)). A raw prompt is the caller's own template and
keeps its control tokens."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specpipe.config.limits import Limits, check_prompt_text
from specpipe.core.errors import InvalidArgument

CHAT_ROLES = ("system", "user", "assistant", "developer")
TEMPLATE_ROLES = {"developer": "system"}  # a role the chat templates lack -> the one they have


def check_input(prompt: str | None, messages: Sequence[tuple[str, str]] | None,
                token_ids: Sequence[int] | None, limits: Limits) -> None:
    """The input's rules before any tokenizing (InvalidArgument naming the field); token ids are a
    GenerationRequest's prompt_ids, checked with it (Generator.validate)."""
    if sum(x is not None for x in (prompt, messages, token_ids)) != 1:
        raise InvalidArgument("give exactly one of prompt, messages or token_ids", field="prompt")
    if messages is not None:
        check_messages(messages, limits)
    elif prompt is not None:
        if not prompt:
            raise InvalidArgument("prompt is empty", field="prompt")
        check_prompt_text(prompt, limits)


def check_messages(messages: Sequence[tuple[str, str]], limits: Limits) -> None:
    if not messages or not any(content for _, content in messages):
        raise InvalidArgument("messages are empty", field="messages")
    for i, (role, _) in enumerate(messages):
        if role not in CHAT_ROLES:
            raise InvalidArgument(f"messages[{i}].role {str(role)[:40]!r} is not supported; roles: "
                                  f"{', '.join(CHAT_ROLES)}", field=f"messages[{i}].role")
    check_prompt_text("".join(content for _, content in messages), limits, "messages")


def chat_ids(tokenizer: Any, messages: Sequence[tuple[str, str]]) -> tuple[int, ...]:
    """The prompt of a chat: the tokenizer's chat template, contents as text; a tokenizer without one
    (a base model): the contents joined by newlines, as text."""
    if getattr(tokenizer, "chat_template", None):
        chat = [{"role": TEMPLATE_ROLES.get(role, role), "content": content} for role, content in messages]
        ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True,
                                            sanitize_control_tokens=True)
        return tuple(ids["input_ids"] if isinstance(ids, Mapping) else ids)
    text = "\n".join(content for _, content in messages)
    return tuple(tokenizer(text, add_special_tokens=True, split_special_tokens=True)["input_ids"])
