"""What one round keeps while its stream flows: the inline scanner, the text shown, the native calls.

Native tool calls are assembled once, by the call strategy's accumulator
(which also builds the response): the round dispatches the calls it reports
complete during the stream and, at the end, the response's others.  Reset
(a new instance) when failover streams the round again.

The run's total output cap (``EngineConfig.max_run_output_chars``) is spent
here, chunk by chunk, from the runner's ``output_left``: the per-call caps
live in the call strategy's aggregator, but only the run sees every round.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Dict, List, Set

from .._accumulate import BLOCK, TextBuffer
from .._inline.scanner import InlineToolScanner
from .._messages import Chunk, Response, ToolCall
from .._output_limits import output_chars, output_limit_error
from .events import TokenEvent

if TYPE_CHECKING:  # pragma: no cover
    from .rounds import RoundRunner


class RoundStream:
    """Everything one round keeps while its stream flows (see the module doc).

    One per round, :meth:`reset` in place when failover streams the round
    again, so its bound :meth:`on_chunk` is handed to the call strategy as it
    is: a chunk costs no forwarding call.
    """

    def __init__(self, runner: RoundRunner, round_no: int) -> None:
        self.runner = runner
        self.round_no = round_no
        state = runner.state
        self._emit = state.emit_here if state.emit_here is not None else state.emit
        self._telemetry = state.telemetry
        self._started = state.started
        self.reset()

    def reset(self) -> None:
        """Start the round's stream afresh: a new scanner, nothing shown, no native call taken."""
        runner = self.runner
        # Ids must stay unique across the rounds of a request: the round is in the prefix.
        self.parser = InlineToolScanner(max_block_chars=runner.config.max_block_chars,
                                        id_prefix=f"call_inline_r{self.round_no}_") if runner.use_inline else None
        # What the person saw (tool blocks left out), joined every BLOCK pieces: memory follows the text.
        self.text_parts = TextBuffer()
        self._parts = self.text_parts.parts  # show() appends here directly
        self._untimed = self._telemetry.time_to_first_token_s is None
        self.native_calls: List[ToolCall] = []  # as dispatched: under the id the run gave each
        #: A native call's run id -> the id its provider gave it, where the run renamed it (the id was taken
        #: by an inline call, or by a failed attempt) but the provider's is still free in this answer.
        self.wire_ids: Dict[str, str] = {}
        self._wire_taken: Set[str] = set()  # the ids this answer's native calls are answered under
        self._taken: Set[int] = set()  # the accumulator's calls handed to the dispatcher (by identity)

    def on_chunk(self, chunk: Chunk) -> None:
        """Called in the driving thread for every chunk: show text, dispatch inline calls at once."""
        content = chunk.content
        runner = self.runner
        runner.output_left -= len(content) if chunk.text_only else output_chars(chunk)
        if runner.output_left < 0:
            cap = runner.config.max_run_output_chars
            raise output_limit_error("run output", cap, "EngineConfig.max_run_output_chars")
        if content:
            parser = self.parser
            if parser is None or (parser.plain and "<" not in content):  # prose: almost every token
                self.show(content)
            else:
                self._take(parser.feed(content))

    def show(self, text: str) -> None:
        """Text the person sees: kept for the answer, timed if it is the run's first, sent as a token."""
        parts = self._parts
        parts.append(text)
        if len(parts) >= BLOCK:
            self.text_parts.compact()
        if self._untimed:
            self._untimed = False
            if self._telemetry.time_to_first_token_s is None:
                self._telemetry.time_to_first_token_s = time.monotonic() - self._started
        self._emit(TokenEvent(text))

    def _take(self, fed: Any) -> None:
        """What the scanner made of some text: show the visible part, report bad blocks, dispatch calls."""
        if fed.visible:
            self.show(fed.visible)
        if fed.errors:
            self.runner.report_parse_problems(fed)
        for call in fed.calls:
            self.runner.calls.dispatch(call)

    def on_tool_calls(self, calls: List[ToolCall]) -> None:
        """Native calls the strategy's accumulator found complete: dispatched at once.

        Each is dispatched under the id the run gives it (:meth:`ToolCalls.own_id`)
        and answered under the provider's own, unless this answer has two calls with
        that id: the second is answered under its run id (``dup_2``).  A call only
        summed up (None) is not answered one by one.
        """
        for call in calls:
            self._taken.add(id(call))
            dispatched = self.runner.calls.dispatch(call)
            if dispatched is None:
                continue
            self.native_calls.append(dispatched)
            if dispatched.id != call.id and call.id not in self._wire_taken:
                self.wire_ids[dispatched.id] = call.id
            self._wire_taken.add(self.wire_ids.get(dispatched.id, dispatched.id))

    def finish(self, response: Response) -> None:
        """The stream completed: release held-back text, dispatch the native calls not dispatched yet."""
        if self.parser is not None:
            self._take(self.parser.flush())
        if self.runner.use_native:
            self.on_tool_calls([call for call in response.tool_calls if id(call) not in self._taken])

    @property
    def committed(self) -> bool:
        """Something reached the caller or a tool started: no failover from here on."""
        return bool(self.text_parts) or self.runner.calls.started_any

    @property
    def text(self) -> str:
        return self.text_parts.text()
