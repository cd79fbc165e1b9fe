"""The prose of docs/benchmarks.md follows the figures of the run that writes it: a reason is
given only when the figures call for it, and is worded from them."""

from __future__ import annotations

from bench import explain, kb

SITES = [
    ("context/compiled.py:142", 1170.0),
    ("store/snapshots.py:127", 641.0),
    ("middleware/pii.py:538", 594.0),
]
HOTSPOTS = [
    {
        "function": "SchemaValidator.validate_json",
        "where": "called from pydantic/x.py:1",
        "share": 0.1,
    },
    {
        "function": "Connection.executemany",
        "where": "called from contextos/store/sqlite.py:604",
        "share": 0.2,
    },
    {
        "function": "Connection.execute",
        "where": "called from contextos/store/sqlite.py:539",
        "share": 0.05,
    },
    {"function": "Connection.execute", "where": "called from bench/sys_raw.py:9", "share": 0.3},
]


def test_resuming_is_explained_only_when_contextos_is_the_slower() -> None:
    assert explain.recovery(1000, 2000, resume_ms=60, langgraph_resume_ms=73) == ""
    why = explain.recovery(1000, 2001, resume_ms=325, langgraph_resume_ms=73)
    assert "325 ms against LangGraph's 73.0 ms" in why
    assert "2,001 events" in why and "1,000-turn run" in why


def test_fan_out_storage_is_explained_only_when_a_child_stores_more_than_a_tenth() -> None:
    assert explain.fanout(100, per_child=1_000, langgraph_per_child=11_300) == ""
    why = explain.fanout(100, per_child=17_000, langgraph_per_child=11_300)
    assert "17.0 kB against LangGraph's 11.3 kB" in why
    assert "1.7 MB for the run" in why and "would be 1.1 kB a child" in why


def test_fan_out_time_is_explained_only_when_a_child_takes_more_than_a_fifth() -> None:
    cpu = {"contextos": 2.0, "langgraph": 9.0}
    assert explain.fanout_time(100, cpu, {"contextos": 2.0, "langgraph": 13.3}, 8.08) == ""
    why = explain.fanout_time(100, cpu, {"contextos": 3.5, "langgraph": 13.3}, 8.08)
    assert "2.0 ms of CPU in its 3.5 ms of wall time, a LangGraph child 9.0 ms in 13.3 ms" in why
    assert "8 events in all" in why and "would be 2.7 ms a child:" in why
    assert "less than the CPU" not in why  # 2.7 ms is more than the 2.0 ms it takes
    slower = explain.fanout_time(100, cpu, {"contextos": 3.5, "langgraph": 7.5}, 8.08)
    assert "would be 1.5 ms a child, less than the CPU a child takes now" in slower


def test_concurrency_is_explained_only_past_one_and_a_half_times_the_ideal() -> None:
    assert explain.concurrency(200, 5, wall_s=1.4, cpu_s=1.2, ideal_s=1.0) == ""
    why = explain.concurrency(200, 5, wall_s=2.22, cpu_s=1.6, ideal_s=1.0)
    assert "take 2.22\u00d7 the ideal" in why
    assert "used 1.60 s of CPU in the 2.22 s" in why and "1.6 ms for each of the 1,000" in why
    assert "for the other 0.62 s it did not run" in why


def test_a_long_runs_growth_names_the_guards_only_when_their_sites_grow() -> None:
    assert explain.long_run([("store/snapshots.py:127", 641.0)], per_turn_kb=900) == ""
    why = explain.long_run(SITES, per_turn_kb=7_732)
    assert "(in `context/compiled.py`, `middleware/pii.py`)" in why
    assert "1,764 kB per 1,000 turns of the 7,732 kB" in why
    assert "snapshots" not in why


def test_the_closing_section_speaks_of_the_bare_turn_only_when_it_misses() -> None:
    met = explain.misses({"per_turn_missed": False})
    assert "Per-turn overhead" not in met and "profile table" not in met
    missed = explain.misses(
        {"per_turn_missed": True, "hotspots": HOTSPOTS, "profile_per_turn_us": 1_000.0}
    )
    # Only the store's statements count as its statements; the raw floor's do not.
    assert "the store's SQLite statements take about 250 µs" in missed
    assert "about 100 µs" in missed


def test_loading_reads_met_missed_or_met_with_little_room_from_the_rounds() -> None:
    def loading(load: float, slowest: float) -> str:
        facts = {"load_turns": 1000, "load_ms": load, "load_max_ms": slowest}
        return explain.misses(facts).split("Loading a 1,000-turn run in under 10 ms** ")[1]

    assert loading(8.6, 9.5).startswith("is met: 8.6 ms, the slowest round 9.5 ms.")
    assert loading(8.6, 12.7).startswith("is met with little room: 8.6 ms, but the slowest")
    assert loading(11.0, 14.0).startswith("is missed: 11.0 ms")


def test_the_knowledge_base_target_is_read_from_the_medians() -> None:
    met = kb._reading([("`scan_kb`", [0.03, 0.05, 0.2]), ("workflow", [0.08, 0.09, 0.04])])
    assert "`scan_kb` meets it (0.050); workflow meets it (0.080)." in met
    missed = kb._reading([("`scan_kb`", [0.05]), ("workflow", [0.12, 0.11, 0.02])])
    assert "`scan_kb` meets it (0.050); workflow misses it (0.110)." in missed
