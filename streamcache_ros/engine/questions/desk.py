"""Where a question is taken: checked, refused in a fixed order, answered from what the memory tier
says it reads (the working memory, or a replay of archived chunks), booked, and given its reach.

    desk = QuestionDesk(adapter, policy, config, ledger, lock, tier, runner, evidence_layers,
                        flush=session.flush, waiting=session.waiting_stamps)
    answer = desk.ask("is the red cube on the table?", ["yes", "no"])
    found = desk.when("is the red cube on the table?", mode="last")

The order of refusals (docs/reliability.md "A refusal changes nothing"): a question that cannot be
asked (empty, too long, an unknown camera) is refused before it takes its turn at the model; one
that would see nothing, even once the frames waiting for their chunk are encoded, is refused
before they are; only then are they encoded and the question answered. The memory tier decides
whether the working memory answers or a replay does (recall/tier.py); the desk asks the replay's
scratch memory the same question and books the answer as its own.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable

from ..adapters import ModelAdapter, match_option
from ..cache import SUMMARY_UNIT, CachePolicy
from ..cache.evidence import OFFSET, AttentionMass
from ..cache.positions import PositionRangeError
from ..config import SessionConfig
from ..errors import ChunkError, QuestionError
from ..memory.ledger import Selection, UnitLedger, Window
from ..recall.tier import MemoryTier, Replay
from ..status import Answer, ChunkReport, EvidenceFrame, Exchange, MemoryCounts, WatchAnswer, WhenAnswer
from ..places import Place
from . import answer_kinds, checks, places
from . import when as when_search
from .answering import YES_NO, QuestionRunner
from .moment import YES, MomentSettings, confirm_moment, find_moment
from .moment import asked as replay_window
from .turns import TurnLock

# a "Did you see ...?" answered no reports at most this P(yes): the best a verification that did not
# confirm gave, kept below even so the probabilities agree with the answer
NOT_YES = 0.49
# a walk's moment the chunk alone does not confirm: the walk goes on past it, this many times a replay
WALK_REJECTIONS = 3


class QuestionDesk:
    def __init__(self, adapter: ModelAdapter, policy: CachePolicy, config: SessionConfig, ledger: UnitLedger,
                 lock: TurnLock, tier: MemoryTier, runner: QuestionRunner, evidence_layers: list[int],
                 flush: Callable[[], object], waiting: Callable[[str], list[float]]):
        self.adapter, self.policy, self.config, self.ledger = adapter, policy, config, ledger
        self.lock, self.tier, self.runner, self.evidence_layers = lock, tier, runner, evidence_layers
        self.flush = flush  # encodes the frames waiting for their chunk (the Session's, under its lock)
        self.waiting = waiting  # the stamps of a camera's frames waiting for their chunk
        # the last answer's attention mass, every measured layer's row (bench/evidence_layers.py reads it)
        self.last_attention_mass: AttentionMass | None = None
        self.moment = MomentSettings(config.when_verify_chunks, config.when_walk_chunks)
        self.clear()

    def clear(self) -> None:
        self.history: list[Exchange] = []  # bounded; HERMES guidance reads it
        self.questions_answered = 0
        self.last_ttft_ms = 0.0

    # -- ask --------------------------------------------------------------------------------------
    def ask(self, question: str, options: list[str] | tuple[str, ...] = (), camera: str = "",
            max_new_tokens: int = 0, on_text: Callable[[str, str], None] | None = None,
            should_stop: Callable[[], bool] | None = None, since: float | None = None,
            until: float | None = None, evidence_k: int | None = None, where: Place | None = None) -> Answer:
        """``Session.ask``: see there."""
        since, until, in_place = self._placed(camera, since, until, where)
        answer = self._ask(question, options, camera, max_new_tokens, on_text, should_stop, since, until, evidence_k)
        holes = self.tier.holes_in(checks.resolved_camera(camera, self.config.cameras), checks.checked_window(since, until))
        answer = places.answer_with_poses(self.tier, answer, in_place)
        return dataclasses.replace(answer, holes=holes, evicted_before=answer.evicted_before or bool(holes))

    def _placed(self, camera: str, since, until, where: Place | None):
        """(since, until, the frames the place holds): under a place, ``since`` the window it limits
        (``checks.checked_window`` takes it as it is) and ``until`` None."""
        if where is None:
            return since, until, 0
        camera = checks.resolved_camera(camera, self.config.cameras)
        window = checks.checked_window(since, until)
        with self.lock.question():  # the frames waiting for their chunk are archived first: their poses count
            self._flush_waiting()
        window, in_place = places.scoped(self.tier, camera, window, where)
        return window, None, in_place

    def _ask(self, question, options, camera, max_new_tokens, on_text, should_stop, since, until, evidence_k) -> Answer:
        started = time.perf_counter()
        vocabulary = answer_kinds.vocabulary_of(self.adapter)
        question = self.as_read(question, vocabulary)
        options = [str(o) for o in options]
        camera = checks.resolved_camera(camera, self.config.cameras)
        budget = max_new_tokens or (self.config.mc_max_new_tokens if options else self.config.max_new_tokens)
        ids = self.question_ids(question, options, camera, budget)
        checks.check_camera_for_now(question, camera, self.config.cameras)
        window = checks.checked_window(since, until)
        evidence_k = self.config.evidence_k if evidence_k is None else int(evidence_k)
        if evidence_k < 0:
            raise QuestionError(f"evidence_k must be >= 0, got {evidence_k}")
        free_text = answer_kinds.check_free_text(question, options, vocabulary, self.adapter.model_id)
        if answer_kinds.asks_if_seen(question, options) and self.config.options_mode == "scored":
            return self._ask_seen(question, options, camera, since, until, evidence_k, on_text, free_text, started)
        with self.lock.question():
            seen = self._select(camera, window, len(ids), budget)
            about_now = bool(checks.NOW_WORDS.search(question))
            replay = self.tier.plan_ask(ids, camera, window, seen.clock, question, about_now=about_now,
                                        about_first=not about_now and bool(checks.FIRST_WORDS.search(question)))
            if replay is None and not seen.units:
                self.ledger.visible(camera, window)  # refuses, as without an archive
            if replay is None:
                return self._ask_memory(ids, seen, question, options, camera, window, budget, on_text, should_stop,
                                        evidence_k, free_text, started)
        # the replay is prefilled and asked off the turn lock: chunks keep being taken in meanwhile
        return self._ask_replay(replay, question, options, camera, max_new_tokens, on_text, should_stop, since,
                                until, evidence_k, started)

    def _ask_memory(self, ids, seen, question, options, camera, window, budget, on_text, should_stop, evidence_k,
                    free_text, started) -> Answer:
        """``ask`` on the working memory, under the turn lock."""
        probe = AttentionMass(self.evidence_layers, self.policy.geometry.num_layers, self.ledger.next_unit,
                              self.policy.geometry.device) if evidence_k else None
        if options and self.config.options_mode == "scored":
            reply = self.runner.score(ids, options, seen, probe, on_text, started)
        else:
            reply = self.runner.decode(ids, budget, started, seen, probe, on_text, should_stop)
        evidence, summary_share = self.rank_evidence(probe, seen.units, window, evidence_k) if probe else ([], 0.0)
        self.last_attention_mass = probe
        self._book(question, reply.text, options, reply.ttft_ms)
        held = self.tier.counts(seen.units, window=window)
        searched_since, evicted_before = self.tier.reach(camera, window, held, self.tier.reads_archive(window))
        index = reply.option_index if reply.option_index is not None else match_option(reply.text, options)
        return Answer(text=reply.text.strip(), option_index=index, answer_tokens=reply.tokens, ttft_ms=reply.ttft_ms,
                      total_ms=(time.perf_counter() - started) * 1e3, frames_in_memory=held.frames,
                      oldest_stamp=held.oldest_stamp, newest_stamp=held.newest_stamp, kv_tokens=held.kv_tokens,
                      cancelled=reply.cancelled, evidence=evidence, evidence_summary_share=summary_share,
                      option_probabilities=reply.probabilities, searched_since=searched_since,
                      evicted_before=evicted_before, frames_in_window=self.tier.frames_in_window(camera, window, held),
                      **free_text.judge(reply.text, reply.cancelled))

    def _ask_replay(self, replay: Replay, question, options, camera, max_new_tokens, on_text, should_stop, since,
                    until, evidence_k, started) -> Answer:
        """``ask`` over a replay of archived chunks (recall/tier.py), booked as this memory's question."""
        answer = replay.session.ask(question, options, camera, max_new_tokens, on_text, should_stop, since, until,
                                    evidence_k)
        window = checks.checked_window(since, until)
        with self.lock.question():
            self._book(question, answer.text, list(options), answer.ttft_ms)
            searched_since, evicted_before = self.tier.reach(camera, window, self.tier.seen_counts(camera, window),
                                                             archive_read=True)
        # a window longer than one replay was read in part: said, as frames held nowhere it read are
        return dataclasses.replace(answer, recalled_chunks=len(replay.chunks), searched_since=searched_since,
                                   evicted_before=evicted_before or replay.left_out > 0,
                                   frames_in_window=self.tier.frames_in_window(camera, window, None),
                                   total_ms=(time.perf_counter() - started) * 1e3)

    def _ask_seen(self, question, options, camera, since, until, evidence_k, on_text, free_text, started) -> Answer:
        """"Did you see X?": yes only where a moment that shows X is found and verified, as `when`
        (mode last) finds it (retrieve, then verify); the moment is the first evidence. A plain
        answer over a long window guesses: the models judge one chunk well and hundreds of frames
        poorly (docs/interfaces.md "Did you see X?")."""
        found = self.when(question, "last", camera, since, until)
        yes = found.found
        p_yes = found.yes_probability if yes else min(found.yes_probability, NOT_YES)
        options = list(options) or list(answer_kinds.YES_NO_OPTIONS)
        said = [o.strip().lower() for o in options]
        index = said.index("yes" if yes else "no")
        probabilities = [p_yes if o == "yes" else 1.0 - p_yes for o in said]
        total_ms = (time.perf_counter() - started) * 1e3
        if on_text is not None:
            on_text(options[index], options[index])
        window = checks.checked_window(since, until)
        evidence = [EvidenceFrame(found.stamp, found.camera, p_yes)] if yes and evidence_k else []
        if evidence:  # then the index's likeliest other sightings in the window (none without an index)
            more = self.tier.sighting_frames(question, camera, window or Window(), evidence_k + 1)
            evidence += [EvidenceFrame(s, c or found.camera, p) for s, c, p in more
                         if abs(s - found.stamp) > 1e-6][:evidence_k - 1]
        oldest, newest = self.tier.span(camera, window)
        with self.lock.question():
            self._book(question, options[index], options, total_ms, counted=True)  # the `when` counted it
        return Answer(text=options[index], option_index=index, answer_tokens=1, ttft_ms=total_ms, total_ms=total_ms,
                      frames_in_memory=found.frames_searched, oldest_stamp=oldest, newest_stamp=newest, kv_tokens=0,
                      evidence=evidence, option_probabilities=probabilities, recalled_chunks=found.recalled_chunks,
                      searched_since=found.searched_since, evicted_before=found.evicted_before,
                      frames_in_window=found.frames_in_window, holes=found.holes, found_by=found.found_by,
                      index_candidates=found.index_candidates, search_complete=found.search_complete,
                      **free_text.judge(options[index]))

    # -- when -------------------------------------------------------------------------------------
    def when(self, question: str, mode: str = "last", camera: str = "", since: float | None = None,
             until: float | None = None, where: Place | None = None) -> WhenAnswer:
        """``Session.when``: see there."""
        since, until, in_place = self._placed(camera, since, until, where)
        found = places.when_with_pose(self.tier, self._when(question, mode, camera, since, until), in_place)
        holes = self.tier.holes_in(checks.resolved_camera(camera, self.config.cameras), checks.checked_window(since, until))
        mode = str(mode or "last").strip().lower()
        if not found.found:
            in_hole = bool(holes)
        elif mode == "first":  # an older yes may have been in a hole before the one found
            in_hole = any(hole.since < found.stamp for hole in holes)
        else:
            in_hole = any(hole.until > found.stamp for hole in holes) if mode == "last" else bool(holes)
        if not found.search_complete:
            self.tier.incomplete_answers += 1
        return dataclasses.replace(found, holes=holes, may_lie_in_hole=in_hole,
                                   evicted_before=found.evicted_before or bool(holes),
                                   may_be_older=found.may_be_older or (mode == "first" and found.found and in_hole))

    def _when(self, question, mode, camera, since, until) -> WhenAnswer:
        started = time.perf_counter()
        mode = str(mode or "last").strip().lower()
        if mode not in when_search.MODES:
            raise QuestionError(f"unknown mode '{mode}' (one of: {', '.join(when_search.MODES)})")
        question = self.as_read(question)
        camera = checks.resolved_camera(camera, self.config.cameras)
        ids = self.question_ids(question, list(YES_NO), camera, 1)
        checks.check_yes_no_question(question)
        answer_kinds.check_words(question, answer_kinds.vocabulary_of(self.adapter), self.adapter.model_id)
        window = checks.checked_window(since, until)
        with self.lock.question():
            seen = self._select(camera, window or Window(), len(ids), 1)
            # a standing question noted its answers over all of the window, or the index covers it
            standing = self.tier.standing_answers(question, camera, window or Window()) if mode != "timeline" else None
            indexed = standing is not None or self.tier.index_covers(camera, window or Window())
            replays = None if indexed else self.tier.plan_when(ids, camera, window or Window(), seen.clock, mode)
            if not indexed and replays is None:
                if not seen.units:
                    self.ledger.visible(camera, window)  # refuses, as without an archive
                return self._when_memory(ids, seen, mode, camera, window, started)
        # the index, and the replays that verify or walk, run off the turn lock: the cameras go on
        if indexed:  # from the standing answers, or retrieved then verified
            found = find_moment(self.tier, question, mode, camera, window or Window(), self.moment, started, standing)
            if found is None:  # the window's frames left the archive (its bound) since it was planned
                found = WhenAnswer(False, 0.0, "", 0.0, [], [], 0, (time.perf_counter() - started) * 1e3, 0,
                                   found_by="index")
            with self.lock.question():
                self.questions_answered += 1
                return self._with_reach(found, camera, window, self.tier.seen_counts(camera, window), True)
        return self._when_replays(replays, question, mode, camera, since, until, started)

    def _when_memory(self, ids, seen, mode, camera, window, started) -> WhenAnswer:
        """``when`` searched in the working memory, under the turn lock."""
        # the frames in memory, as frames_in_memory counts them: one count of what was searched
        counted = self.ledger.counted(self.policy.unit_tokens(), seen.units) or seen.units
        units = sorted(counted, key=lambda u: (min(self.ledger.units[u].stamps), u))
        found = when_search.search(mode, len(units), lambda windows: self.runner.yes([ids] * len(windows), [
            [units[i] for i in w] for w in windows], seen.clock), when_search.SearchSettings.within(
            self.config.rows_per_pass, self.config.chunk_frames // self.adapter.frames_per_unit))
        self.questions_answered += 1
        found = when_search.answer(found, mode, [self.ledger.units[u] for u in units], window or Window(),
                                   (time.perf_counter() - started) * 1e3)
        searched = self.tier.counts(units, window) if found.frames_searched else None
        return self._with_reach(found, camera, window, searched, self.tier.archive is not None)

    def _with_reach(self, found: WhenAnswer, camera: str, window: Window | None, held: MemoryCounts | None,
                    archive_read: bool) -> WhenAnswer:
        """``found`` with its reach (``MemoryTier.reach``); ``may_be_older`` kept only where frames
        older than the edge it lies at were evicted."""
        searched_since, evicted_before = self.tier.reach(camera, window, held, archive_read)
        return dataclasses.replace(found, searched_since=searched_since, evicted_before=evicted_before,
                                   frames_in_window=self.tier.frames_in_window(camera, window, held),
                                   may_be_older=found.found and found.may_be_older and evicted_before)

    def _when_replays(self, replays, question, mode, camera, since, until, started) -> WhenAnswer:
        """``when`` over the archive's replays (at least one), tried in order until one finds the
        answer (recall/tier.py), off the turn lock. A moment a replay's search finds is judged a
        second time, its chunk replayed alone (``confirm_moment``); one it does not confirm is passed
        over and the search goes on in the same replay past it, WALK_REJECTIONS times at most."""
        found, chunks, asked, searched, at_edge, left_out, gave_up = None, 0, 0, 0, False, 0, False
        window = checks.checked_window(since, until) or Window()
        for tried, replay in enumerate(replays):
            left_out += replay.left_out  # a timeline over a window longer than one replay
            span = window
            for _ in range(WALK_REJECTIONS + 1):
                try:
                    found = replay.session.when(question, mode, camera, *replay_window(span, replay))
                except QuestionError:  # past the moment passed over (or, under a place, none there): not here
                    found = dataclasses.replace(found or WhenAnswer(False, 0.0, "", 0.0, [], [], 0, 0.0, 0), found=False)
                    break
                chunks, asked = chunks + len(replay.chunks) * (span is window), asked + found.questions_asked
                if not found.found or mode == "timeline":
                    break
                confirmed = confirm_moment(self.tier, question, camera, found.stamp, window)
                chunks, asked = chunks + 1, asked + 1
                if confirmed is None or confirmed >= YES:
                    break
                # not confirmed: the search goes on past that moment's chunk, in this replay
                held = next((r for r in replay.chunks if r.first_stamp <= found.stamp <= r.last_stamp), None)
                edge = held.first_stamp if held is not None else found.stamp
                span = (Window(span.since, edge - 1e-6, span.frames) if mode == "last" else
                        Window((held.last_stamp if held is not None else found.stamp) + 1e-6, span.until, span.frames))
                found = dataclasses.replace(found, found=False, yes_probability=confirmed)
                if span.since > span.until:
                    break
            else:
                gave_up = True  # more moments than it would confirm: the rest of this replay unread
            searched += found.frames_searched
            at_edge = found.may_be_older and tried == 0  # mode first walks the oldest replay first
            if found.found or gave_up:  # past an unread part, a later replay's moment is not the answer
                break
        found = dataclasses.replace(found, recalled_chunks=chunks, questions_asked=asked, frames_searched=searched,
                                    may_be_older=at_edge, total_ms=(time.perf_counter() - started) * 1e3,
                                    found_by="walk", search_complete=found.search_complete and not left_out
                                    and not (gave_up and not found.found))
        window = checks.checked_window(since, until)
        with self.lock.question():
            self.questions_answered += 1
            found = self._with_reach(found, camera, window, self.tier.seen_counts(camera, window), archive_read=True)
        return dataclasses.replace(found, evicted_before=found.evicted_before or left_out > 0)

    # -- standing questions -------------------------------------------------------------------------
    def watch(self, questions: list[str], chunk: ChunkReport) -> list[WatchAnswer]:
        """``Session.watch``: see there."""
        vocabulary = answer_kinds.vocabulary_of(self.adapter)
        read = [self.as_read(q, vocabulary) for q in questions]  # noted as `when` will look them up
        prompts = [self.question_ids(q, list(YES_NO), "", 1) for q in read]
        with self.lock.question():
            units = [u for u, info in self.ledger.units.items() if info.chunk == chunk.chunk_id]
            if not prompts or not units:
                return []
            p_yes = self.runner.yes(prompts, [units] * len(prompts), self.ledger.clock(chunk.camera))
            self.tier.note_watch(chunk.chunk_id, dict(zip(read, p_yes)))
        stamp = max(self.ledger.stamps(units), default=0.0)
        return [WatchAnswer(q, chunk.camera, stamp, p) for q, p in zip(questions, p_yes)]

    def check_yes_no_question(self, question: str) -> None:
        """QuestionError unless ``question`` could be asked by ``when`` or stand in ``watch_questions``:
        not empty, a yes/no question in words the model knows, short enough with its prompt. Touches
        no memory."""
        limit = self.config.max_question_tokens
        question = self.as_read(question)
        checks.check_question(question, list(YES_NO), limit)
        checks.check_yes_no_question(question)
        answer_kinds.check_words(question, answer_kinds.vocabulary_of(self.adapter), self.adapter.model_id)
        checks.check_prompt_length(self.adapter.question_ids(question, list(YES_NO)), limit)

    def as_read(self, question: str, vocabulary=False) -> str:
        """``question`` in the spellings its model's questions were trained with ("colour" -> "color"
        for the bundled world models; as it is for a model that declares no words): tokenised,
        checked, looked up in the index and noted by standing questions in one spelling."""
        vocabulary = answer_kinds.vocabulary_of(self.adapter) if vocabulary is False else vocabulary
        return vocabulary.spelled(question) if vocabulary is not None else question

    # -- the parts ---------------------------------------------------------------------------------
    def rank_evidence(self, probe: AttentionMass, units: list[int] | None = None, window: Window | None = None,
                      k: int = 3, layers: list[int] | None = None) -> tuple[list[EvidenceFrame], float]:
        """The ``k`` frames of ``units`` with the most attention mass over ``layers`` (default: the
        measured ones), and the summary tokens' share (``UnitLedger.rank_evidence``)."""
        totals = probe.totals(layers).tolist()
        return self.ledger.rank_evidence(totals[OFFSET:], totals[SUMMARY_UNIT + OFFSET], units, window, k)

    def _book(self, question: str, text: str, options: list[str], ttft_ms: float, counted: bool = False) -> None:
        """An answered question in the bounded history and the counters (``counted``: already in
        ``questions_answered``)."""
        self.history.append(Exchange(question, text, options))
        del self.history[:-self.config.history_size]
        self.questions_answered += 0 if counted else 1
        self.last_ttft_ms = ttft_ms

    def question_ids(self, question: str, options: list[str], camera: str, answer_tokens: int) -> list[int]:
        """The question's token ids with its prompt; QuestionError for anything that cannot be asked
        (checked before the question touches the cache)."""
        limit = self.config.max_question_tokens
        checks.check_question(question, options, limit)
        checks.check_camera_name(camera, self.config.cameras)
        ids = self.adapter.question_ids(question, options)
        checks.check_prompt_length(ids, limit)
        checks.check_answer_room(len(ids), answer_tokens,
                                 self.config.largest_question(self.policy.geometry.max_position_embeddings))
        return ids

    def _select(self, camera: str, window: Window | None, prompt_tokens: int, answer_tokens: int) -> Selection:
        """Under the lock: the queued frames encoded, then what a question about ``camera`` over
        ``window`` sees, with positions made for its prompt and answer; QuestionError when it sees
        nothing or they do not fit. Whether it would see anything is checked before the queued
        frames are encoded, so a refusal leaves them waiting; the room for its prompt and answer
        was checked before (``question_ids``)."""
        checks.check_camera_seen(camera, self.ledger.cameras, self.config.cameras)
        self._check_something_seen(camera, window)
        self._flush_waiting()
        try:
            seen = self.ledger.visible(camera, window)
        except QuestionError:
            # the working memory sees nothing there (or holds nothing yet, after a restart): the
            # archive may; the tier plans a replay, and the caller refuses when it has nothing either
            if not self.tier.holds(window, camera):
                raise
            seen = Selection([], None, window, None)
        try:
            self.policy.ensure_room(prompt_tokens + answer_tokens, seen.clock)
        except PositionRangeError as err:
            raise QuestionError(f"the question ({prompt_tokens} tokens) and its answer (max_new_tokens {answer_tokens}) "
                                f"do not fit in the positions left: {err}") from None
        return seen

    def _flush_waiting(self) -> None:
        """The frames waiting for their chunk encoded (under the lock); a full memory still answers
        from what it holds."""
        try:
            self.flush()
        except ChunkError as err:
            if not err.position_range:
                raise

    def _check_something_seen(self, camera: str, window: Window | None) -> None:
        """QuestionError when a question about ``camera`` over ``window`` would see nothing even once
        the queued frames are encoded: none of them, no frame in the working memory and none in
        the archive falls there; or only fragments of frames the archive lost to a hole. With an
        archive the refusal says what it holds and names the holes (``MemoryTier.absence``)."""
        waiting = self.waiting(camera)
        if any((window or Window()).holds(stamp) for stamp in waiting):
            return
        if self.tier.holds(window, camera):
            return
        archived = self.tier.holds(None, camera)  # the archive holds this camera's stream, elsewhere in time
        if archived and window is not None and self.tier.holes_in(camera, window):
            held = self.tier.seen_counts(camera, window)  # HERMES's fragments of a frame are not the frame
            if held is None or not held.frames:
                raise QuestionError(self.tier.absence(camera, window))
        if not self.ledger.units and waiting and not archived:
            raise QuestionError(f"no frames between {Window.describe(window.since)} and {Window.describe(window.until)} "
                                f"(the frames waiting for their chunk are stamped {min(waiting):.3f} to "
                                f"{max(waiting):.3f}): widen since/until")
        try:
            self.ledger.visible(camera, window)  # refuses when it sees nothing there
        except QuestionError:
            if archived:  # say what the archive holds, never "wait for the camera stream"
                raise QuestionError(self.tier.absence(camera, window)) from None
            raise
