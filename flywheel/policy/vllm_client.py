"""The clients of a managed vLLM server (`vllm_server.py` starts, swaps and stops it; plain code: no dagster here).

`ManagedVLLMGenerator` makes the server serve its checkpoint, then sends the prompts through
`StreamingOpenAIGenerator`, which streams each answer and closes the stream at the end of the action line.

Crashes: `ManagedVLLMGenerator` restarts a dead server and retries the rows that failed;
rows that still fail come back with `Generation.error` set, and the rollout engine records the
episode as errored (as it does for env crashes). A request the server refuses (HTTP 4xx, e.g. a
prompt longer than `max_model_len`) fails its row at once: a retry cannot fix it; a prompt that no longer fits
the context comes back as `Generation.context_full`, and the engine ends that episode there, failed.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from flywheel.core.deadline import map_on_daemon_threads
from flywheel.policy.inference import (
    Generation,
    Message,
    OpenAICompatibleGenerator,
    action_line_end,
    clip_answer,
    context_full,
    cut_after_action,
    looping,
)
from flywheel.policy.vllm_server import SERVED_NAME, VLLMServer, VLLMServerError

log = logging.getLogger(__name__)


def _retryable(exc: BaseException) -> bool:
    """Worth a server restart: connection lost, timeout, HTTP 5xx. Not a 4xx (the request itself is bad)."""
    import openai

    if isinstance(exc, openai.APIStatusError):
        return exc.status_code >= 500
    return isinstance(exc, openai.APIConnectionError | openai.APITimeoutError | VLLMServerError | OSError)


class StreamingOpenAIGenerator(OpenAICompatibleGenerator):
    """`OpenAICompatibleGenerator` that streams each answer and closes the stream at the end of the
    action line (vLLM aborts the request when its client goes), as `TransformersGenerator` stops there.

    Token counts come from vLLM's per-chunk usage (`continuous_usage_stats`), so `completion_tokens`
    counts what was generated up to the stop, as today's transformers rows do.
    """

    def __init__(self, *, base_url: str, model: str, concurrency: int, timeout: float,
                 stop_on_loop: bool = False) -> None:
        super().__init__(base_url=base_url, model=model, concurrency=concurrency, request_timeout_s=timeout)
        self.client = self.client.with_options(timeout=timeout, max_retries=0)  # retries: the manager's job
        self.stop_on_loop = stop_on_loop  # close the stream once the answer loops (inference.looping)

    def complete(self, messages: list[Message], *, temperature: float, max_new_tokens: int,
                 seed: int | None = None) -> Generation:
        stream = self.client.chat.completions.create(
            model=self.model, messages=messages, temperature=temperature, max_tokens=max_new_tokens,
            seed=seed, stream=True,
            extra_body={"stream_options": {"include_usage": True, "continuous_usage_stats": True}},
        )
        text, prompt_tokens, completion_tokens, chunks = "", 0, 0, 0
        try:
            for chunk in stream:
                if chunk.usage is not None:
                    prompt_tokens, completion_tokens = chunk.usage.prompt_tokens, chunk.usage.completion_tokens
                if chunk.choices and chunk.choices[0].delta.content:
                    text += chunk.choices[0].delta.content
                    chunks += 1
                    if "\n" in chunk.choices[0].delta.content and action_line_end(text) != -1:
                        break
                    if self.stop_on_loop and chunks % 8 == 0 and looping(text):
                        break
        finally:
            stream.close()
        return Generation(text=cut_after_action(clip_answer(text, max_new_tokens)), prompt_tokens=prompt_tokens,
                          completion_tokens=completion_tokens)

    def generate(
        self, prompts: list[list[Message]], *, temperature: float, max_new_tokens: int, seed: int | None = None
    ) -> list[Generation]:
        # Daemon threads: an interrupted rollout (SIGTERM) exits without joining requests still in flight.
        return map_on_daemon_threads(lambda m: self.complete(m, temperature=temperature, max_new_tokens=max_new_tokens,
                                                             seed=seed), prompts, self.concurrency,
                                     abandon=self.abandoned)


class ManagedVLLMGenerator:
    """A `Generator` on a `VLLMServer`: makes the server serve its checkpoint, then sends each prompt
    through `OpenAICompatibleGenerator` (streamed; closed at the end of the action line).

    `concurrent`: rollouts may call `generate` from one thread per env slot at once (the server
    batches the requests); a server that dies under them is restarted once, not once per thread."""

    concurrent = True

    def __init__(self, server: VLLMServer, checkpoint_path: str, model_id: str, *, stop_on_loop: bool = False) -> None:
        self.server = server
        self.checkpoint_path = str(Path(checkpoint_path).resolve())
        self.model_id = model_id
        self.stop_on_loop = stop_on_loop
        self._client: StreamingOpenAIGenerator | None = None
        self._client_port: int | None = None
        server.ensure(self.checkpoint_path)

    def client(self, port: int | None = None) -> StreamingOpenAIGenerator:
        """The client for the server on `port` (default: the server's port now)."""
        port = self.server.port if port is None else port
        client = self._client
        if client is None or self._client_port != port:
            client = StreamingOpenAIGenerator(
                base_url=f"{self.server.url_on(port)}/v1", model=SERVED_NAME,
                concurrency=self.server.cfg.concurrency, timeout=self.server.cfg.request_timeout_s,
                stop_on_loop=self.stop_on_loop,
            )
            self._client, self._client_port = client, port
        return client

    def generate(
        self, prompts: list[list[Message]], *, temperature: float, max_new_tokens: int, seed: int | None = None
    ) -> list[Generation]:
        out: list[Generation | None] = [None] * len(prompts)
        errors: dict[int, str] = {}
        todo = list(range(len(prompts)))
        restarts = 0
        while todo:
            try:
                self.server.ensure(self.checkpoint_path)
            except VLLMServerError as exc:
                errors.update(dict.fromkeys(todo, f"vLLM server: {exc}"))
                break
            # The process and the port the rows go to, read together: a thread that read the port of a
            # server that another thread has since replaced must not take the new one for the one that failed.
            pid, port = self.server.endpoint()
            client = self.client(port)

            def one(i: int, client: StreamingOpenAIGenerator = client) -> tuple[int, Generation | BaseException]:
                # Distinct seeds per row: equal prompts (samples of one task) must not get equal samples.
                row_seed = None if seed is None or not self.server.cfg.sends_seeds() else \
                    (seed * 1_000_003 + i) % (2**31 - 1)
                try:
                    return i, client.complete(prompts[i], temperature=temperature, max_new_tokens=max_new_tokens,
                                              seed=row_seed)
                except Exception as exc:  # noqa: BLE001 - sorted below into retry / row error
                    return i, exc

            with ThreadPoolExecutor(max_workers=max(1, min(self.server.cfg.concurrency, len(todo)))) as pool:
                results = list(pool.map(one, todo))
            retry = []
            for i, res in results:
                if isinstance(res, Generation):
                    out[i] = res
                elif _retryable(res):
                    retry.append(i)
                    errors[i] = f"{type(res).__name__}: {res}"
                else:  # refused (4xx): a retry cannot help; a prompt past the context ends its episode, failed
                    out[i] = Generation("", 0, 0, error=f"{type(res).__name__}: {res}", context_full=context_full(res))
            if not retry:
                break
            if restarts >= self.server.cfg.max_restarts:
                break
            restarts += 1
            if self.server.pid != pid:
                pass  # another thread has already replaced the server these rows failed on: retry on the new one
            elif self.server.healthy():
                # The server answers health checks: a transient failure; retry the rows once more as they are.
                log.warning("vLLM: %d request(s) failed on a healthy server; retrying", len(retry))
            else:
                try:
                    self.server.restart(f"dead server: {errors[retry[0]]}", failed_pid=pid)
                except VLLMServerError as exc:
                    errors.update(dict.fromkeys(retry, f"vLLM restart failed: {exc}"))
                    break
            for i in retry:
                errors.pop(i, None)
            todo = retry
        return [g if g is not None else Generation("", 0, 0, error=errors.get(i, "no answer"))
                for i, g in enumerate(out)]
