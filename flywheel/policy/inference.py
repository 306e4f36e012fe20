"""Inference backends behind one small interface.

The rollout engine hands a whole batch of chat prompts (one per live episode) to
`generate`; a backend decides how to batch them. Generation stops at the end of
the `Action:` line, so the model never writes the next observation itself.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Any, Protocol

from flywheel.core.deadline import RequestsAbandoned, http_client, map_on_daemon_threads, retry_within
from flywheel.core.redaction import Redactor
from flywheel.policy.models import load_model, load_tokenizer, set_threads

Message = dict[str, str]
# One phrase of 2-60 characters repeated 8+ times in a row: a small model stuck in a loop.
_LOOP = re.compile(r"(.{2,60}?)\1{7,}", re.S)
LOOP_WINDOW = 1000  # characters at the end of an answer searched for a loop
# An answer can hold at most this many characters per generated token; anything longer (a server
# ignoring max_tokens, a hostile endpoint) is cut to it before it is parsed (`clip_answer`).
MAX_CHARS_PER_TOKEN = 16


def clip_answer(text: str, max_new_tokens: int) -> str:
    """`text` cut to what `max_new_tokens` tokens can hold (MAX_CHARS_PER_TOKEN each)."""
    return text[: max(max_new_tokens, 1) * MAX_CHARS_PER_TOKEN]


def action_line_end(text: str) -> int:
    """The end (past its newline) of the first complete action line: `Action:`, something not blank,
    then a newline; -1 when there is none. Linear in len(text): no regex backtracking."""
    start = text.find("Action:")
    while start != -1:
        newline = text.find("\n", start)
        if newline == -1:
            return -1
        if text[start + 7 : newline].strip():
            return newline + 1
        start = text.find("Action:", start + 7)  # a blank action line holds no other `Action:`
    return -1


def looping(text: str) -> bool:
    """True when an answer without an action line so far ends in a degenerate loop.

    Such an answer almost never reaches an Action line (measured on cpu-scienceworld-quick's k=0:
    every one of 491 evaluation steps without an action line ran to max_new_tokens, 471 of them
    looping; 3 of 1,068 steps with an action had an 5-fold repeat before it), so generation can stop
    there: the step is the same invalid-format step, without the rest of the token budget.
    """
    return action_line_end(text) == -1 and _LOOP.search(text[-LOOP_WINDOW:]) is not None


@dataclass(frozen=True)
class Generation:
    text: str
    prompt_tokens: int
    completion_tokens: int
    # Set when no answer could be had (e.g. the policy server stayed down): the episode is errored.
    error: str = ""
    # The prompt no longer fits the policy's context (the server's max_model_len): the episode can go no further
    # and ends there, failed (a property of the policy and its history, not an error; `error` says why).
    context_full: bool = False


def context_full(exc: BaseException) -> bool:
    """An OpenAI-compatible server refused the prompt for its length (vLLM: HTTP 400 "This model's maximum
    context length is N tokens. However, your prompt contains at least M input tokens")."""
    return getattr(exc, "status_code", None) == 400 and "maximum context length" in str(exc).lower()


class Generator(Protocol):
    """`generate` answers a batch of chat prompts. A generator that may also be called from many
    threads at once, one prompt per call, because something else batches concurrent requests
    (an inference server), says so with a class attribute `concurrent = True`; rollouts then
    let every env slot play on its own (`RolloutConfig.scheduling`)."""

    model_id: str

    def generate(
        self, prompts: list[list[Message]], *, temperature: float, max_new_tokens: int, seed: int | None = None
    ) -> list[Generation]: ...


def cut_after_action(text: str) -> str:
    """Keep everything up to and including the first complete action line."""
    end = action_line_end(text)
    return text[: end - 1] if end != -1 else text.strip()


def action_line_stop(tokenizer, prompt_len: int, newline_ids, *, stop_on_loop: bool = False, loop_every: int = 8):
    """A `StoppingCriteria`: a row is done once its generated text holds a complete action line.

    That can only become true when the token just generated contains a newline, so only those
    rows are decoded: one tensor op per token instead of decoding every row at every token
    (which cost more than a tiny model's forward pass). With `stop_on_loop`, every `loop_every`
    tokens the live rows are also decoded and a row stuck in a loop (`looping`) is done.
    """
    import torch
    from transformers import StoppingCriteria

    class ActionLineStop(StoppingCriteria):
        def __init__(self) -> None:
            self.done: torch.Tensor | None = None

        def __call__(self, input_ids, scores, **kwargs):  # type: ignore[override]
            if self.done is None:
                self.done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
            fresh = torch.isin(input_ids[:, -1], newline_ids) & ~self.done
            for row in fresh.nonzero().flatten().tolist():
                if action_line_end(tokenizer.decode(input_ids[row, prompt_len:], skip_special_tokens=True)) != -1:
                    self.done[row] = True
            if stop_on_loop and (input_ids.shape[1] - prompt_len) % loop_every == 0:
                for row in (~self.done).nonzero().flatten().tolist():
                    if looping(tokenizer.decode(input_ids[row, prompt_len:], skip_special_tokens=True)):
                        self.done[row] = True
            return self.done.clone()

    return ActionLineStop()


class TransformersGenerator:
    """Batched `model.generate` with left padding and a per-row stop at the action line."""

    def __init__(
        self,
        model_path: str,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        max_batch_size: int = 8,
        model_id: str | None = None,
        num_threads: int = 0,
        stop_on_loop: bool = False,
    ) -> None:

        self.stop_on_loop = stop_on_loop
        set_threads(num_threads)
        self.tokenizer = load_tokenizer(model_path)
        self.model = load_model(model_path, device=device, dtype=dtype)
        self.device = device
        self.max_batch_size = max_batch_size
        self.model_id = model_id or str(model_path)
        self._newlines = None

    def _newline_ids(self):
        """Ids of every vocabulary token whose text contains a newline (computed once)."""
        import torch

        if self._newlines is None:
            texts = self.tokenizer.batch_decode([[i] for i in range(len(self.tokenizer))])
            ids = [i for i, t in enumerate(texts) if "\n" in t]
            self._newlines = torch.tensor(ids, dtype=torch.long, device=self.device)
        return self._newlines

    def render(self, messages: list[Message]) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def count_prompt_tokens(self, messages: list[Message]) -> int:
        return len(self.tokenizer(self.render(messages), add_special_tokens=False)["input_ids"])

    def generate(
        self, prompts: list[list[Message]], *, temperature: float, max_new_tokens: int, seed: int | None = None
    ) -> list[Generation]:
        import torch

        if seed is not None:
            torch.manual_seed(seed)
        texts = [self.render(m) for m in prompts]
        # Similar lengths in one batch waste less padding.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out: list[Generation | None] = [None] * len(texts)
        for start in range(0, len(order), self.max_batch_size):
            idx = order[start : start + self.max_batch_size]
            for i, gen in zip(idx, self._generate_batch([texts[i] for i in idx], temperature, max_new_tokens), strict=True):
                out[i] = gen
        return [g for g in out if g is not None]

    def _generate_batch(self, texts: list[str], temperature: float, max_new_tokens: int) -> list[Generation]:
        import torch
        from transformers import StoppingCriteriaList

        tok = self.tokenizer
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        prompt_len = enc["input_ids"].shape[1]

        stop = action_line_stop(tok, prompt_len, self._newline_ids(), stop_on_loop=self.stop_on_loop)
        sampling = temperature > 0
        with torch.inference_mode():
            seqs = self.model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=sampling,
                temperature=temperature if sampling else None,
                top_p=0.95 if sampling else None,
                top_k=None,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
                stopping_criteria=StoppingCriteriaList([stop]),
            )
        results = []
        prompt_lens = enc["attention_mask"].sum(dim=1).tolist()
        for row, n_prompt in zip(seqs[:, prompt_len:], prompt_lens, strict=True):
            ids = row.tolist()
            if tok.pad_token_id in ids:  # finished rows are padded to the batch's end
                ids = ids[: ids.index(tok.pad_token_id)] if tok.pad_token_id != tok.eos_token_id else ids
            if tok.eos_token_id in ids:
                ids = ids[: ids.index(tok.eos_token_id)]
            text = cut_after_action(tok.decode(ids, skip_special_tokens=True))
            results.append(Generation(text=text, prompt_tokens=int(n_prompt), completion_tokens=len(ids)))
        return results


class OpenAICompatibleGenerator:
    """Any OpenAI-compatible server (vLLM's `api_server`, a hosted model): the GPU seam.

    Requests are sent concurrently; the server does the batching. The key is masked in
    everything the server sends back (answers, error bodies) before it reaches the store or a log.
    """

    concurrent = True  # the OpenAI client is thread-safe; the server batches

    def __init__(self, *, base_url: str, model: str, api_key: str = "EMPTY", concurrency: int = 16,
                 request_timeout_s: float = 600.0, max_retries: int = 2) -> None:
        from openai import OpenAI

        # Each request ends within request_timeout_s in all (connect, first byte, whole answer), retries included.
        self.client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=request_timeout_s,
                             http_client=http_client(request_timeout_s))
        self.model = model
        self.redact = Redactor([api_key])
        self.model_id = self.redact(f"{base_url}#{model}")
        self.concurrency = concurrency
        self.request_timeout_s, self.max_retries = request_timeout_s, max_retries
        self.abandoned = threading.Event()

    def abandon(self) -> None:
        """Stop waiting for requests in flight (the rollouts were interrupted): every `generate` waiting, and every
        later one, raises RequestsAbandoned at once, so that no slot thread keeps the process from exiting."""
        self.abandoned.set()

    def generate(
        self, prompts: list[list[Message]], *, temperature: float, max_new_tokens: int, seed: int | None = None
    ) -> list[Generation]:
        def attempt(messages: list[Message], left_s: float) -> Any:
            return self.client.chat.completions.create(
                model=self.model, messages=messages, temperature=temperature,
                max_tokens=max_new_tokens, seed=seed, timeout=left_s,
            )

        def one(messages: list[Message]) -> Generation:
            try:
                resp = retry_within(self.request_timeout_s, lambda left_s: attempt(messages, left_s),
                                    retryable=_retryable, max_attempts=self.max_retries + 1)
            except Exception as exc:  # noqa: BLE001 - its message may echo the key: re-raised redacted
                if context_full(exc):  # the episode ends there, failed (Generation.context_full)
                    return Generation("", 0, 0, error=self.redact(str(exc)), context_full=True)
                raise RuntimeError(f"policy endpoint failed: {self.redact.exception(exc)} (request_timeout_s "
                                   f"{self.request_timeout_s:g} s per request, its retries included)") from None
            text = self.redact(cut_after_action(clip_answer(resp.choices[0].message.content or "", max_new_tokens)))
            usage = resp.usage
            return Generation(
                text=text,
                prompt_tokens=usage.prompt_tokens if usage else 0,
                completion_tokens=usage.completion_tokens if usage else 0,
            )

        # Daemon threads: an interrupted rollout (SIGTERM) exits without joining requests still in flight.
        if self.abandoned.is_set():
            raise RequestsAbandoned("this generator was interrupted: no new request")
        return map_on_daemon_threads(one, prompts, self.concurrency, abandon=self.abandoned)


def _retryable(exc: Exception) -> bool:
    """A failure another attempt may get past: a timeout, a lost connection, 408, 429 or 5xx."""
    status = getattr(exc, "status_code", None)
    if status is not None:
        return status in (408, 429) or status >= 500
    return type(exc).__name__ in {"APITimeoutError", "APIConnectionError"}
