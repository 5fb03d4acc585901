"""app.figures and app.metrics: tree layout, colours and shapes, escaping, bars, histogram,
race and text marks, from hand-made traces and from a trace recorded on a tiny model."""
from __future__ import annotations

import json

import pytest

from app import figures, metrics, page_html
from app.metrics import ACCEPTED, BONUS, CUT, REJECTED, ROOT
from clover import Engine
from clover.methods import ALL_METHODS, METHOD_LABELS
from clover.trace import StepTrace, TreeNode
from conftest import ScriptedHeads, oracle_tree_fn, tiny_target

OKABE_ITO = {"#000000", "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00",
             "#CC79A7"}


def node(i, parent, depth, p, text, target_p=0.5, token=None):
    return TreeNode(i, 100 + i if token is None else token, text, parent, depth, p, target_p)


def hand_step(step=0, total=3) -> StepTrace:
    """root 'A' -> {2: '\\n' (0.7) -> {4: ' d' (0.9) -> {5: '<x>'}, 3: 'c' (0.5)}, 1: ' b' (0.2)};
    accepted 0 -> 2 -> 4, bonus '!'."""
    nodes = [node(0, -1, 0, 1.0, "A", 1.0), node(1, 0, 1, 0.2, " b", 0.01),
             node(2, 0, 1, 0.7, "\n", 0.9), node(3, 2, 2, 0.5, "c", 0.05),
             node(4, 2, 2, 0.9, " d", 0.8), node(5, 4, 3, 0.6, "<x>", 0.1)]
    return StepTrace(step=step, nodes=nodes, accepted=[0, 2, 4], bonus_token=7, bonus_text="!",
                     new_tokens=[102, 104, 7], accepted_length=3, draft_ms=2.0, verify_ms=8.0,
                     total_tokens=total)


def plain_step(step, total, ms=5.0, text="x") -> StepTrace:
    return StepTrace(step=step, nodes=[node(0, -1, 0, 1.0, "r", 1.0)], accepted=[0],
                     bonus_token=9, bonus_text=text, new_tokens=[9], accepted_length=1,
                     draft_ms=0.0, verify_ms=ms, total_tokens=total)


def chain_step(step, total, accepted_depth, drafted_depth=3, ms=10.0) -> StepTrace:
    """A chain of ``drafted_depth`` drafts of which the first ``accepted_depth`` are accepted."""
    nodes = [node(0, -1, 0, 1.0, "r", 1.0)]
    nodes += [node(d, d - 1, d, 0.5, f"t{d}") for d in range(1, drafted_depth + 1)]
    kept = [100 + d for d in range(1, accepted_depth + 1)] + [9]
    return StepTrace(step=step, nodes=nodes, accepted=list(range(accepted_depth + 1)),
                     bonus_token=9, bonus_text="b", new_tokens=kept,
                     accepted_length=accepted_depth + 1, draft_ms=ms / 2, verify_ms=ms / 2,
                     total_tokens=total)


# ---------------------------------------------------------------- escaping


def test_escape_token_makes_whitespace_visible():
    assert figures.escape_token(" a\n\tb\r") == "␣a\\n\\tb\\r"
    assert figures.escape_token("") == "∅"
    assert figures.escape_token("\x01") == "\\x01"
    assert figures.escape_token("héllo") == "héllo"


def test_token_label_is_clipped_and_html_safe():
    assert figures.token_label("<|im_end|>") == "&lt;|im_end|&gt;"
    assert figures.token_label("abcdefghijklmnop", max_chars=6) == "abcde…"
    assert figures.token_label("  x") == "␣␣x"


# ---------------------------------------------------------------- tree layout


def test_tree_layout_positions_by_depth_and_sibling_order():
    placed = {p.key: p for p in figures.tree_layout(hand_step())}
    assert set(placed) == {0, 1, 2, 3, 4, 5, 6}  # 6 = the bonus token
    for p in placed.values():
        assert p.x == p.depth
    # siblings top to bottom by falling draft probability
    assert placed[2].y < placed[1].y          # 0.7 above 0.2
    assert placed[4].y < placed[3].y          # 0.9 above 0.5
    # the bonus comes after the last accepted node, one level deeper, on top of its siblings
    bonus = placed[6]
    assert bonus.status == BONUS and bonus.parent == 4 and bonus.x == 3
    assert bonus.text == "!" and bonus.draft_prob is None
    assert bonus.y < placed[5].y
    # leaves take consecutive rows; a parent is centred on its children
    assert sorted(placed[k].y for k in (6, 5, 3, 1)) == [0, 1, 2, 3]
    assert placed[4].y == pytest.approx((placed[6].y + placed[5].y) / 2)
    assert placed[0].y == pytest.approx((placed[2].y + placed[1].y) / 2)
    assert [placed[k].status for k in range(6)] == [ROOT, REJECTED, ACCEPTED, REJECTED,
                                                    ACCEPTED, REJECTED]


def test_tree_layout_of_plain_decoding_is_root_and_bonus():
    placed = figures.tree_layout(plain_step(0, 1))
    assert [(p.status, p.x) for p in placed] == [(ROOT, 0), (BONUS, 1)]
    assert placed[0].y == placed[1].y == 0


def _traces_by_status(fig):
    return {t.meta: t for t in fig.data if t.meta in (ROOT, ACCEPTED, BONUS, REJECTED)}


def test_tree_figure_colours_shapes_legend_and_hover():
    fig = figures.tree_figure(hand_step(), total_steps=3)
    by = _traces_by_status(fig)
    assert set(by) == {ROOT, ACCEPTED, BONUS, REJECTED}
    assert [len(by[s].x) for s in (ROOT, ACCEPTED, BONUS, REJECTED)] == [1, 2, 1, 3]
    colours = {s: by[s].marker.color for s in by}
    symbols = {s: by[s].marker.symbol for s in by}
    assert len(set(colours.values())) == 4 and len(set(symbols.values())) == 4
    assert set(colours.values()) <= OKABE_ITO
    for t in by.values():
        assert t.showlegend is not False and t.name
    # labels and hover show escaped tokens and both probabilities
    assert "\\n" in by[ACCEPTED].text and "␣d" in by[ACCEPTED].text
    assert "&lt;x&gt;" in by[REJECTED].text
    hover = " ".join(by[ACCEPTED].hovertext)
    assert "draft p = 0.700" in hover and "target p = 0.900" in hover
    assert "produced by the target" in by[BONUS].hovertext[0]
    # edges: the accepted path 0 -> 2 -> 4, then a dotted edge to the bonus
    edges = {t.name: t for t in fig.data if t.name and t.name.startswith("edges")}
    assert edges["edges: path"].line.color == colours[ACCEPTED]
    assert list(edges["edges: bonus"].x) == [2, 3, None]
    assert sum(x is None for x in edges["edges: path"].x) == 2
    # the title wraps (a phone's width) and reads as one line once the breaks are gone
    title = fig.layout.title.text
    assert "<br>" in title and max(len(line) for line in title.split("<br>")) <= 40
    assert ("Step 1 of 3: 2 of 5 drafted tokens accepted + bonus → 3 tokens"
            in title.replace("<br>", ""))
    json.loads(fig.to_json())  # serialisable for gr.Plot


# ---------------------------------------------------------------- metrics


def test_node_statuses_and_token_origins():
    step = hand_step()
    assert metrics.node_statuses(step) == [ROOT, REJECTED, ACCEPTED, REJECTED, ACCEPTED, REJECTED]
    origins = metrics.token_origins([step, plain_step(1, 4, text="?")])
    assert [(o.text, o.depth, o.step) for o in origins] == [
        ("\n", 1, 0), (" d", 2, 0), ("!", 0, 0), ("?", 0, 1)]


def test_token_origins_follow_a_cut_step():
    step = hand_step()
    # generation ended after the first accepted draft (EOS, stop string or max_new_tokens)
    step.accepted, step.cut, step.bonus_committed = [0, 2], [4], False
    step.new_tokens, step.accepted_length, step.stop_reason = [102], 1, "eos"
    assert [(o.text, o.depth) for o in metrics.token_origins([step])] == [("\n", 1)]
    assert metrics.node_statuses(step) == [ROOT, REJECTED, ACCEPTED, REJECTED, CUT, REJECTED]
    placed = figures.tree_layout(step)
    assert len(placed) == len(step.nodes) and BONUS not in {p.status for p in placed}
    assert figures.step_title(step) == ("Step 1: 2 of 5 drafted tokens accepted, output ends "
                                        "at end of sequence after 1 → 1 token")
    # depths past the end count neither as drafted nor as reached
    assert metrics.acceptance_by_depth([step]) == [(1, 1, 1)]


def test_token_origins_use_completed_characters():
    step = hand_step()
    step.new_text = ["", "\U0001f999", "!"]  # a character completed by the second token
    assert [o.text for o in metrics.token_origins([step])] == ["", "\U0001f999", "!"]
    html = page_html.tokens_html([step])
    assert "\U0001f999" in html and "\ufffd" not in html


def test_acceptance_by_depth_and_histogram():
    steps = [chain_step(0, 3, 2), chain_step(1, 4, 0), chain_step(2, 8, 3),
             chain_step(3, 10, 1, drafted_depth=1)]
    assert metrics.acceptance_by_depth(steps) == [(1, 3, 4), (2, 2, 3), (3, 1, 3)]
    assert metrics.accepted_length_counts(steps) == {1: 1, 2: 1, 3: 1, 4: 1}
    assert metrics.best_step(steps) == 2
    fig = figures.acceptance_figure({"ar": [plain_step(0, 1)], "clover": steps})
    assert [t.name for t in fig.data] == ["Clover"]
    assert list(fig.data[0].y) == pytest.approx([75.0, 200 / 3, 100 / 3])
    assert list(fig.data[0].x) == ["depth 1", "depth 2", "depth 3"]
    hist = figures.accepted_length_figure({"medusa": steps[:2], "clover": steps})
    assert [t.name for t in hist.data] == ["Medusa", "Clover"]
    assert list(hist.data[0].x) == [1, 2, 3, 4]
    assert list(hist.data[0].y) == pytest.approx([50, 0, 50, 0])
    assert list(hist.data[1].customdata) == [1, 1, 1, 1]
    # bars carry a second cue besides colour
    assert hist.data[0].marker.pattern.shape != hist.data[1].marker.pattern.shape


def test_acceptance_figures_without_drafts_say_so():
    fig = figures.acceptance_figure({"ar": [plain_step(0, 1)]})
    assert not fig.data and "plain decoding" in fig.layout.annotations[0].text


def test_timeline_speedup_and_stats():
    plain = [plain_step(i, i + 1, ms=10.0) for i in range(6)]          # 6 tokens in 60 ms
    spec = [chain_step(0, 3, 2, ms=15.0), chain_step(1, 6, 2, ms=15.0)]  # 6 tokens in 30 ms
    assert metrics.timeline(spec) == [(0.0, 0), (15.0, 3), (30.0, 6)]
    assert metrics.time_to_tokens(plain, 3) == pytest.approx(30.0)
    assert metrics.time_to_tokens(plain, 7) is None
    assert metrics.tokens_at(spec, 14.9) == 0 and metrics.tokens_at(spec, 15.0) == 3
    assert metrics.speedup(spec, plain) == pytest.approx(2.0)
    assert metrics.speedup(spec[:1], plain) == pytest.approx(30.0 / 15.0)
    assert metrics.speedup(plain, plain) == pytest.approx(1.0)
    assert metrics.speedup(spec, []) is None
    # the baseline stopped earlier (EOS when sampling): compare tokens per second
    assert metrics.speedup(spec, plain[:2]) == pytest.approx((6 / 30) / (2 / 20))
    # in lockstep: over the rounds both ran (2 steps each), plain's load spike in its
    # rounds 3-6 (steps of 40 ms) does not count against it
    slow = [plain_step(i, i + 1, ms=10.0 if i < 2 else 40.0) for i in range(6)]
    assert metrics.speedup(spec, slow) == pytest.approx(180.0 / 30.0)
    assert metrics.speedup(spec, slow, lockstep=True) == pytest.approx((6 / 30) / (2 / 20))
    assert metrics.speedup(plain, plain, lockstep=True) == pytest.approx(1.0)
    assert metrics.speedup(spec, [], lockstep=True) is None
    s = metrics.run_stats(spec)
    assert (s.steps, s.tokens, s.tokens_per_step) == (2, 6, 3.0)
    assert s.tokens_per_second == pytest.approx(200.0)
    assert (s.draft_ms, s.verify_ms) == (7.5, 7.5)
    assert metrics.run_stats([]).tokens == 0


def test_speedup_counts_turns_and_batch_rows():
    """The one speedup definition (clover.trace) reads a conversation's turns one after
    another and a batched run's rows as sharing each step's time."""
    from dataclasses import replace

    from clover import trace
    assert metrics.speedup is trace.speedup  # the app shows the bench's definition
    # two turns: the second turn's total_tokens restarts at 1, tokens still add up
    turns = [plain_step(0, 1, ms=10.0), plain_step(1, 2, ms=10.0), plain_step(0, 1, ms=10.0)]
    assert trace.timeline(turns)[-1] == (30.0, 3)
    spec = [chain_step(0, 3, 2, ms=15.0)]
    assert trace.speedup(spec, turns) == pytest.approx(30.0 / 15.0)
    # a batch of two rows: a step's time counts once, both rows' tokens count
    rows = [replace(plain_step(k, k + 1, ms=10.0), row=r) for r in (0, 1) for k in range(3)]
    assert trace.timeline(rows) == [(0.0, 0), (10.0, 2), (20.0, 4), (30.0, 6)]
    batch_spec = [replace(chain_step(0, 3, 2, ms=15.0), row=r) for r in (0, 1)]
    assert trace.speedup(batch_spec, rows) == pytest.approx(30.0 / 15.0)
    assert trace.speedup(rows, rows) == pytest.approx(1.0)


def test_race_figure_replays_recorded_times():
    runs = {"ar": [plain_step(i, i + 1, ms=10.0) for i in range(6)],
            "clover": [chain_step(0, 3, 2, ms=15.0), chain_step(1, 6, 2, ms=15.0)]}
    assert figures.race_end_ms(runs) == pytest.approx(60.0)

    def bars(fig):
        return {t.y[0]: t.x[0] for t in fig.data if t.type == "bar"}

    assert bars(figures.race_figure(runs, 0.0)) == {"Plain": 0, "Clover": 0}
    assert bars(figures.race_figure(runs, 31.0)) == {"Plain": 3, "Clover": 6}
    end = figures.race_figure(runs)
    assert bars(end) == {"Plain": 6, "Clover": 6}
    lines = {t.name: t for t in end.data if t.type == "scatter" and t.mode == "lines"}
    assert list(lines["Clover"].x) == pytest.approx([0.0, 0.015, 0.030])
    assert lines["Plain"].line.dash != lines["Clover"].line.dash
    assert "0.06 s" in end.layout.title.text
    labels = {t.y[0]: t.text[0] for t in end.data if t.type == "bar"}
    assert labels == {"Plain": "6 tok · stopped at 0.06 s", "Clover": "6 tok · stopped at 0.03 s"}
    runs["clover"][-1].finished = True
    labels = {t.y[0]: t.text[0] for t in figures.race_figure(runs, 45.0).data if t.type == "bar"}
    assert labels == {"Plain": "4 tok", "Clover": "6 tok · done in 0.03 s"}

    # the timelines the browser replays from (app/race_replay.js), with their traces
    race = end.layout.meta["race"]
    assert race["end_ms"] == pytest.approx(60.0) and race["fps"] > 0 and race["seconds"] > 0
    assert [r["name"] for r in race["runs"]] == ["Plain", "Clover"]
    for r in race["runs"]:
        bar, line, marker = (end.data[i] for i in r["traces"])
        assert bar.type == "bar" and bar.y[0] == r["name"] and bar.x[0] == r["tokens"][-1]
        assert line.mode == "lines" and line.name == r["name"] and list(line.y) == r["tokens"]
        assert list(line.x) == pytest.approx([ms / 1e3 for ms in r["ms"]])
        assert marker.mode == "markers" and marker.y[0] == r["tokens"][-1]
    assert [r["finished"] for r in figures.race_figure(runs).layout.meta["race"]["runs"]] == [False, True]
    longer = dict(runs, ar=runs["ar"] + [plain_step(6, 7, ms=10.0)])  # another run, another key
    assert figures.race_figure(longer).layout.meta["race"]["key"] != race["key"]


def test_every_method_has_a_style_and_a_name_and_races():
    assert set(figures.METHOD_STYLE) == set(ALL_METHODS)
    assert set(METHOD_LABELS) >= set(ALL_METHODS)
    for cue in ("dash", "symbol", "color"):  # each method tells apart by line, marker and colour
        values = [figures.METHOD_STYLE[m][cue] for m in ALL_METHODS]
        assert len(set(values)) == len(values), cue
    runs = {"ar": [plain_step(i, i + 1, ms=10.0) for i in range(6)],
            "clover2": [chain_step(0, 3, 2, ms=15.0), chain_step(1, 6, 2, ms=15.0)],
            "clover2+lookup": [chain_step(0, 4, 3, ms=12.0)]}
    fig = figures.race_figure(runs)
    assert {t.y[0]: t.x[0] for t in fig.data if t.type == "bar"} == {
        "Plain": 6, "Clover-2": 6, "Clover-2 + lookup": 4}
    lines = {t.name: t for t in fig.data if t.type == "scatter" and t.mode == "lines"}
    assert lines["Clover-2"].line.dash == figures.METHOD_STYLE["clover2"]["dash"]
    assert list(lines["Clover-2"].x) == pytest.approx([0.0, 0.015, 0.030])
    hist = figures.accepted_length_figure({m: s for m, s in runs.items() if m != "ar"})
    assert [t.name for t in hist.data] == ["Clover-2", "Clover-2 + lookup"]


def test_tokens_html_marks_origins():
    out = page_html.tokens_html([hand_step(), plain_step(1, 4, text="<|im_end|>")])
    assert out.count(" data-step=") == 4
    assert f"background:{figures.DEPTH_BG[1]}" in out and f"background:{figures.DEPTH_BG[2]}" in out
    assert 'title="step 1: accepted draft, depth 2"' in out
    assert 'title="step 1: produced by the target"' in out
    assert "&lt;|im_end|&gt;" in out and "<|im_end|>" not in out
    assert "↵" in out  # a newline token stays visible
    assert "produced by the target" in page_html.tokens_legend()


def test_tokens_html_outlines_the_step_on_display_and_names_each_tokens_step():
    steps = [hand_step(), plain_step(1, 4, text=" end")]
    last = page_html.tokens_html(steps)  # by default the latest step is outlined
    assert last.count('class="current-step"') == 1 and 'data-step="2"' in last
    first = page_html.tokens_html(steps, current=0)
    assert first.count('class="current-step"') == steps[0].accepted_length
    assert first.count('data-step="1"') == steps[0].accepted_length
    assert page_html.CURRENT_OUTLINE in first
    assert "current-step" not in page_html.tokens_html(steps, current=None)


def test_metrics_html_shows_cards_and_table():
    stats = metrics.run_stats([chain_step(0, 3, 2)])
    out = page_html.metrics_html("clover", stats, page_html.SpeedCard(1.5, "quiet"),
                               page_html.SpeedCard(0.8, "busy"), [("ar", stats, "done", None), ("clover", stats, "done", 1.25)], "note")
    for label in ("tokens / step", "tokens / s", "draft ms / step", "verify ms / step",
                  "speedup vs plain", "speedup vs Medusa"):
        assert label in out
    assert "1.50× ▲" in out and "0.80× ▼" in out and "3.00" in out and "1.25×</td>" in out
    assert 'data-state="quiet"' in out and 'data-state="busy"' in out
    before = page_html.metrics_html("clover", stats, page_html.SpeedCard(None, "before"),
                                  page_html.SpeedCard(None, "before"))
    # before any run a card asks for a run, never for Compare (which is on by default)
    assert "—" in before and "press Run to measure" in before and "Compare" not in before


# ---------------------------------------------------------------- a recorded trace


@pytest.fixture(scope="module")
def recorded():
    target = tiny_target("llama", vocab_size=64)
    prompt = [5, 9, 11, 3]
    ref = Engine(target).generate(prompt, 30)
    heads = ScriptedHeads(target, oracle_tree_fn(prompt + ref.token_ids, target.vocab_size,
                                                 seed=1))
    out = Engine(target, heads).generate(prompt, 30)
    assert out.token_ids == ref.token_ids
    return out


def test_layout_of_a_recorded_trace(recorded):
    assert any(len(s.accepted) > 2 for s in recorded.steps)
    for step in recorded.steps:
        placed = figures.tree_layout(step)
        assert len(placed) == len(step.nodes) + step.bonus_committed
        by_key = {p.key: p for p in placed}
        for p in placed:
            assert p.x == p.depth
            if p.parent >= 0:
                assert by_key[p.parent].x == p.x - 1
        statuses = [p.status for p in placed[:len(step.nodes)]]
        assert [n.id for n, s in zip(step.nodes, statuses) if s in (ROOT, ACCEPTED)] == step.accepted
        if step.bonus_committed:
            assert placed[-1].status == BONUS
            assert placed[-1].depth == step.nodes[step.accepted[-1]].depth + 1
        # siblings (bonus aside) ordered by falling draft probability
        for parent in {n.parent for n in step.nodes if n.parent >= 0}:
            kids = sorted((p for p in placed if p.status != BONUS and p.parent == parent), key=lambda p: p.y)
            assert [p.draft_prob for p in kids] == sorted((p.draft_prob for p in kids), reverse=True)
        # the rows of the drafted nodes never collide
        leaves = [p for p in placed if not any(q.parent == p.key for q in placed)]
        assert len({p.y for p in leaves}) == len(leaves)
        fig = figures.tree_figure(step, len(recorded.steps))
        shown = sum(len(t.x) for t in fig.data if t.meta in (ROOT, ACCEPTED, BONUS, REJECTED, CUT))
        assert shown == len(step.nodes) + step.bonus_committed


def test_origins_and_bars_of_a_recorded_trace(recorded):
    origins = metrics.token_origins(recorded.steps)
    assert len(origins) == len(recorded.token_ids)
    # one bonus per step (the last one's only if committed)
    assert sum(o.depth == 0 for o in origins) == sum(s.bonus_committed for s in recorded.steps)
    assert max(o.depth for o in origins) >= 2
    rows = metrics.acceptance_by_depth(recorded.steps)
    assert rows[0][0] == 1 and all(0 <= r <= n for _, r, n in rows)
    counts = metrics.accepted_length_counts(recorded.steps)
    assert sum(counts.values()) == len(recorded.steps)
    assert sum(k * v for k, v in counts.items()) == len(recorded.token_ids)
    assert metrics.run_stats(recorded.steps).tokens_per_step == pytest.approx(
        recorded.mean_accepted_length)


def test_tree_animation_has_a_frame_per_step_with_fixed_traces():
    steps = [hand_step(0, 3), plain_step(1, 4), hand_step(2, 7)]
    fig = figures.tree_animation(steps)
    assert [f.name for f in fig.frames] == ["0", "1", "2"]
    assert all(len(f.data) == len(fig.data) == 9 for f in fig.frames)
    # frame 1 is plain decoding: no rejected drafts; frame 2 shows the hand tree's rejects
    rejected = [next(t for t in f.data if t.meta == REJECTED) for f in fig.frames]
    assert len(rejected[1].x) == 0 and len(rejected[2].x) == 3
    assert [s.label for s in fig.layout.sliders[0].steps] == ["1", "2", "3"]
    assert fig.layout.updatemenus[0].buttons[0].label == "Play"
    assert "step 3" in fig.frames[2].layout.title.text.lower()
    assert len(figures.tree_animation(steps, max_frames=2).frames) == 2
    with pytest.raises(ValueError, match="no steps"):
        figures.tree_animation([])


def test_tree_figure_rings_the_nodes_prompt_lookup_proposed():
    step = hand_step()
    step.nodes[2].source, step.nodes[4].source, step.nodes[1].source = "both", "lookup", "head"
    fig = figures.tree_figure(step)
    ring = next(t for t in fig.data if t.meta == "lookup")
    assert ring.showlegend and ring.name == "proposed by prompt lookup"
    assert sorted(zip(ring.x, ring.y)) == sorted((p.x, p.y) for p in figures.tree_layout(step)
                                                 if p.key in (2, 4))
    hover = " ".join(_traces_by_status(fig)[ACCEPTED].hovertext)
    assert "proposed by prompt lookup" in hover and "drafted by the heads and proposed" in hover
    # a heads-only step has the same traces, the ring empty and out of the legend
    plain = next(t for t in figures.tree_figure(hand_step()).data if t.meta == "lookup")
    assert len(plain.x) == 0 and not plain.showlegend


# ---------------------------------------------------------------- the step panels


def traced_step() -> StepTrace:
    """:func:`hand_step` as the engine records it: the target's top tokens after each node
    and where the tree sat in the KV cache (12 committed positions before it)."""
    s = hand_step()
    wants = {0: [(102, "\n", 0.9), (101, " b", 0.01)], 1: [(9, "z", 0.6)],
             2: [(104, " d", 0.8), (103, "c", 0.05)], 3: [(9, "z", 0.5)],
             4: [(7, "!", 0.7), (105, "<x>", 0.1)], 5: [(9, "z", 0.4)]}
    for n in s.nodes:
        n.target_top = wants[n.id]
    s.prefix_length = 12
    return s


def test_verify_rows_show_what_the_target_wanted_at_the_parent():
    from app import step_panels

    s = traced_step()
    rows = step_panels.verify_rows(s, greedy=True)
    assert [r.node for r in rows] == [1, 2, 3, 4, 5]
    assert [r.status for r in rows] == [REJECTED, ACCEPTED, REJECTED, ACCEPTED, REJECTED]
    for r in rows:  # the target's top tokens at the node's parent
        parent = s.nodes[r.node].parent
        assert r.wanted == [(t, p) for _, t, p in s.nodes[parent].target_top]
        assert r.chance is None
    # greedy: an accepted draft is the target's first choice at its parent, a rejected one not
    assert all((r.text == r.wanted[0][0]) == (r.status == ACCEPTED) for r in rows)
    # sampling: children tried in node order, each against what its rejected siblings left
    sampled = {r.node: r for r in step_panels.verify_rows(s, greedy=False)}
    assert sampled[1].chance == pytest.approx(0.01)
    assert sampled[2].chance == pytest.approx(0.9 / 0.99)
    assert sampled[3].chance == pytest.approx(0.05)
    assert sampled[4].chance == pytest.approx(0.8 / 0.95)
    assert sampled[5].chance == pytest.approx(0.1)  # its parent 4 was accepted
    fig = step_panels.verify_figure(s, greedy=True)
    cells = fig.data[0].cells.values
    assert list(cells[0]) == [1, 2, 3, 4, 5] and "✗ rejected" in cells[3][0]
    assert cells[6][0].startswith("\\n 0.90")  # node 1 ' b': the target wanted '\n'
    assert len(step_panels.verify_figure(s, greedy=False).data[0].cells.values) == 8
    plain = step_panels.verify_figure(plain_step(0, 1))
    assert "Nothing was drafted" in plain.layout.annotations[0].text


def test_mask_matches_the_tree_parents_and_positions_follow_depth():
    from app import step_panels

    s = traced_step()
    m = step_panels.mask_matrix(s)
    n = len(s.nodes)
    assert len(m) == n and all(len(row) == n + 1 for row in m)

    def ancestors(i):
        out = {i}
        while s.nodes[i].parent >= 0:
            i = s.nodes[i].parent
            out.add(i)
        return out

    for i in range(n):
        assert m[i][0]  # every node sees the committed prefix
        assert {j for j in range(n) if m[i][1 + j]} == ancestors(i)
    assert step_panels.position_ids(s) == [12 + nd.depth for nd in s.nodes]
    fig = step_panels.mask_figure(s)
    heat = fig.data[0]
    assert [[bool(v) for v in row] for row in heat.z] == m
    assert heat.x[0] == "prefix (12)" and heat.y[4].endswith("pos 14")  # node 4, depth 2
    assert heat.colorscale[-1][1] == figures.STATUS_STYLE[BONUS]["color"]  # today's blue


def test_kv_update_keeps_exactly_the_accepted_path():
    from app import step_panels

    s = traced_step()
    rows = step_panels.kv_update(s)
    assert [i for i, kept, _ in rows if kept] == s.accepted == [0, 2, 4]
    assert [slot for _, kept, slot in rows if kept] == [12, 13, 14]
    assert all(slot is None for _, kept, slot in rows if not kept)
    fig = step_panels.kv_figure(s)
    kept, dropped = fig.data
    assert list(kept.x) == [0, 2, 4] and list(dropped.x) == [1, 3, 5]
    assert kept.marker.color == figures.STATUS_STYLE[ACCEPTED]["color"]
    assert dropped.marker.color == figures.STATUS_STYLE[REJECTED]["color"]
    assert kept.marker.symbol != dropped.marker.symbol  # a second cue beside colour
    assert "after: 15" in fig.layout.title.text
    all_kept = step_panels.kv_figure(chain_step(0, 3, accepted_depth=3))
    assert all_kept.layout.showlegend and len(all_kept.data[1].x) == 0  # the legend stays
    # a step cut at the end of generation keeps its whole verified path
    s.accepted, s.cut = [0, 2], [4]
    assert [i for i, kept, _ in step_panels.kv_update(s) if kept] == [0, 2, 4]


def test_regressive_inputs_are_the_drafted_parents_tokens():
    from app import step_panels

    s = traced_step()
    rows = step_panels.regressive_inputs(s)
    assert rows == [(1, 0, [1, 2]), (2, 2, [3, 4]), (3, 4, [5])]
    for depth, parent, kids in rows:
        for k in kids:  # the input of a drafted node is its parent's drafted token
            assert s.nodes[k].parent == parent and s.nodes[k].depth == depth
    table = step_panels.regressive_figure(s, "clover").data[0].cells.values
    assert list(table[0]) == [1, 2, 3]
    assert table[2][1] == "\\n ✓" and table[3][0] == "the target's token (root)"
    assert table[4][1] == "c ✗ · ␣d ✓"
    assert "Medusa" in step_panels.regressive_figure(s, "medusa").layout.annotations[0].text
    s.nodes[5].source = "lookup"  # nodes only prompt lookup proposed had no head input
    assert step_panels.regressive_inputs(s)[-1] == (2, 2, [3, 4])


def test_speed_panel_reads_the_measured_curve():
    from app import step_panels

    facts = step_panels.SpeedFacts(costs=[10.0, 11.0, 12.5, 14.0], budget=10, auto=True,
                                   device="cpu", tokens_per_step=2.5, verified_per_step=6.0,
                                   measured=1.6, draft_ms=1.0)
    # verify_ms(costs, 6) = 14 + 2 x the mean slope (4 / 3): the step costs that plus 1 ms drafting
    assert step_panels.expected_speedup(facts) == pytest.approx(2.5 * 10 / (14 + 8 / 3 + 1.0))
    text = step_panels.speed_reading(facts)
    assert "**1.42×**" in text and "**1.60×**" in text and "10 drafted tokens (auto" in text
    assert "1.0 ms of drafting" in text
    assert "On a CPU each extra verified token costs real time" in text
    assert "beyond the 4 measured sizes" in text
    fig = step_panels.speed_figure(facts)
    assert list(fig.data[0].y) == facts.costs
    assert [t.meta for t in fig.data[1:]] == ["extended", "run"] and fig.data[2].x == (6.0,)
    inside = step_panels.SpeedFacts([10.0, 11.0, 12.5, 14.0], None, False, "cuda", 1.0, 1.0, None)
    assert [t.meta for t in step_panels.speed_figure(inside).data[1:]] == ["run"]
    text = step_panels.speed_reading(inside)
    assert "no tree of draft heads" in text and "beyond" not in text and "On a GPU" in text
    none = step_panels.SpeedFacts(None, None, False, "cpu", 1.0, 1.0, 0.9)
    text = step_panels.speed_reading(none)
    assert "not measured" in text and "1.00 tokens per step" in text and "**0.90×**" in text


def test_a_lookup_variant_wears_its_base_methods_colour():
    """"Clover + lookup" is a darker shade of Clover's colour (the same hue), so a legend
    with lookup methods pairs each with its base method at a glance."""
    import colorsys

    from clover.methods import METHOD_COLORS

    def hls(c):
        return colorsys.rgb_to_hls(*(int(c[i:i + 2], 16) / 255 for i in (1, 3, 5)))

    for m, c in METHOD_COLORS.items():
        if m.endswith("+lookup"):
            (h, light, _), (hb, light_b, _) = hls(c), hls(METHOD_COLORS[m[:-len("+lookup")]])
            assert min(abs(h - hb), 1 - abs(h - hb)) < 0.03 and light < light_b, m


def test_the_text_race_marks_each_token_with_the_engine_time_of_its_step():
    """One row per method that ran; each token carries the engine ms after the step that
    committed it (what race_replay.js reveals it by), coloured by where it came from."""
    import re

    clover = [chain_step(0, 3, 2, ms=10.0), chain_step(1, 5, 1, ms=12.0)]
    plain = [chain_step(i, i + 1, 0, drafted_depth=0, ms=8.0) for i in range(5)]
    out = page_html.text_race_html({"clover": clover, "ar": plain})
    rows = re.findall(r"data-method='([^']+)'", out)
    assert rows == ["ar", "clover"]  # in the methods' own order
    clover_row = out.split("data-method='clover'")[1]
    assert re.findall(r'data-ms="([\d.]+)"', clover_row) == ["10.0"] * 3 + ["22.0"] * 2
    plain_row = out.split("data-method='ar'")[1].split("data-method=")[0]
    assert re.findall(r'data-ms="([\d.]+)"', plain_row) == ["8.0", "16.0", "24.0", "32.0", "40.0"]
    assert figures.DEPTH_BG[2] in clover_row and figures.TARGET_BG in plain_row
    assert "race-row" not in page_html.text_race_html({})


def test_time_panel_splits_each_methods_step_and_gives_its_break_even():
    """The waterfall of a step's parts (step_panels.time_figure): the method on display,
    its Medusa and plain decoding; each bar's parts sum to the mean step, and each
    speculative bar names its tokens per step and its break-even (its step over plain's)."""
    from dataclasses import replace

    from app import step_panels

    def timed(s, draft, update, forward, accept):
        return replace(s, draft_ms=draft + update, update_ms=update, forward_ms=forward,
                       accept_ms=accept, verify_ms=forward + accept)

    runs = {"ar": [timed(plain_step(i, i + 1), 0.0, 0.1, 30.0, 0.4) for i in range(4)],
            "medusa+lookup": [timed(chain_step(0, 2, 1), 1.0, 0.1, 40.0, 0.9)],
            "clover+lookup": [timed(chain_step(0, 3, 2), 3.0, 0.2, 40.0, 0.8)],
            "clover": [timed(chain_step(0, 3, 2), 3.0, 0.2, 40.0, 0.8)]}
    assert step_panels.time_methods("clover+lookup", runs) == ["clover+lookup", "medusa+lookup", "ar"]
    assert step_panels.time_methods("clover", runs) == ["clover", "ar"]  # no plain Medusa ran
    fig = step_panels.time_figure("clover+lookup", runs)
    assert [t.meta for t in fig.data] == ["draft", "update", "forward", "accept"]
    assert list(fig.data[0].y) == ["Clover + lookup", "Medusa + lookup", "Plain"]
    steps = [sum(t.x[k] for t in fig.data) for k in range(3)]
    assert steps == pytest.approx([44.0, 42.0, 30.5])
    notes = [a.text for a in fig.layout.annotations]
    assert "3.00 tokens a step; breaks even at 1.44" in notes[0]  # 44 / 30.5
    assert "1 token a step" in notes[2]
    empty = step_panels.time_figure("clover", {})
    assert not empty.data and "Run a prompt" in empty.layout.annotations[0].text
