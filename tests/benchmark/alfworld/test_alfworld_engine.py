"""The engine caches' command memo: it answers only what the stock derivation would."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memprism_ray.benchmark.alfworld import engine


def _goto_context(pddl: Any) -> tuple[str, dict[str, Any]]:
    """A ``go to`` command's template and derivation context, as ``PddlEnv._gather_infos`` builds them."""
    state = pddl._pddl_state
    action = next(a for a in state.all_applicable_actions() if a.command_template.startswith("go to"))
    context = {
        "state": state,
        "facts": list(state.facts),
        "variables": {ph.name: pddl._entity_infos[var.name] for ph, var in action.mapping.items()},
        "mapping": action.mapping,
        "entity_infos": pddl._entity_infos,
    }
    return action.command_template, context


@pytest.fixture()
def loaded(alfworld_games: dict) -> Any:
    engine.install_engine_caches()
    env = engine.make_engine()
    env.load(str(alfworld_games["train"][0].path))
    env.reset()
    yield env.unwrapped
    env.close()


def test_the_memo_rederives_when_a_fact_its_query_reads_changes(loaded: Any) -> None:
    import textworld.envs.pddl.textgen as textgen

    stock = engine._ORIGINALS["derive"]
    grammar = loaded._logic.grammar
    template, context = _goto_context(loaded)
    assert engine._ORIGINALS and textgen.ContextSensitiveGrammar.derive is not stock
    first = grammar.derive(template, context)
    assert first == stock(grammar, template, context) and first.startswith("go to ")
    hits = dict(engine._STATS)["command_hits"]
    assert grammar.derive(template, context) == first
    assert dict(engine._STATS)["command_hits"] == hits + 1

    # The query reads receptacleatlocation: without that fact the stock derivation lists nothing.
    state = context["state"]
    r = next(var for ph, var in context["mapping"].items() if ph.name == "r")
    fact = next(f for f in state.facts if f.name == "receptacleatlocation" and f.arguments[0].name == r.name)
    state.remove_fact(fact)
    try:
        changed = grammar.derive(template, context)
        assert changed == stock(grammar, template, context) != first
    finally:
        state.add_fact(fact)
    assert grammar.derive(template, context) == first


def test_the_memo_leaves_rules_with_conditions_to_the_stock_derivation(loaded: Any) -> None:
    memo = engine._MEMO
    assert memo is not None
    assert memo.plan("#goto.feedback#") is None  # a #rule#: its conditions may read any fact
    plan = memo.plan("go to [{r.name | receptacleatlocation(r:receptacle, lend:location)}]")
    assert plan is not None and plan.queries and plan.lists
    assert plan.names == {"r", "lend"} and "receptacleatlocation" in plan.predicates
    take = memo.plan("take {o} from {r}")
    assert take is not None and take.names == {"o", "r"} and not take.queries and not take.predicates

    # A list separator that depends on the state makes every [...] template stock.
    grammar = loaded._logic.grammar
    assert memo.list_texts(grammar) == ("nothing", ", ", ", and ")
    sep = grammar._rules["list_separator"][0]
    saved, sep.condition = sep.condition, "opened(r:receptacle)"
    memo.lists.pop(grammar, None)
    try:
        template, context = _goto_context(loaded)
        assert memo.key(grammar, template, context) is None
    finally:
        sep.condition = saved
        memo.lists.pop(grammar, None)


def test_without_the_memo_derivation_is_stock(loaded: Any) -> None:
    import textworld.envs.pddl.textgen as textgen

    engine.uninstall_engine_caches()
    try:
        engine.install_engine_caches(command_memo=False)
        assert textgen.ContextSensitiveGrammar.derive is engine._ORIGINALS["derive"]
    finally:
        engine.uninstall_engine_caches()
        engine.install_engine_caches()
    assert textgen.ContextSensitiveGrammar.derive is not engine._ORIGINALS["derive"]


def _transcript(game: Any, steps: int = 6) -> list[tuple[str, tuple[str, ...], bool]]:
    from memprism_ray.benchmark.alfworld import AlfworldEnv

    with AlfworldEnv(1) as env:
        obs = env.reset(game)
        out = [(obs.text, obs.admissible, False)]
        for i in range(steps):
            tr = env.step(out[-1][1][i % len(out[-1][1])])
            out.append((tr.feedback, tr.admissible, tr.won))
            if tr.done:
                break
    return out


def test_translations_on_disk_are_read_by_a_fresh_cache_and_a_damaged_one_is_replaced(
    alfworld_games: dict, tmp_path: Path
) -> None:
    games = alfworld_games["eval_out_of_distribution"][:2]
    sas_dir = tmp_path / "sas"

    def fresh() -> dict[str, int]:  # what another process starts with: the files only
        engine.uninstall_engine_caches()
        engine.install_engine_caches(sas_dir=sas_dir)
        return dict(engine._STATS)

    try:
        s0 = fresh()
        translated = [_transcript(g) for g in games]
        s1 = fresh()
        files = sorted(sas_dir.iterdir())
        assert len(files) == 2 * len(games) and s1["translate_misses"] - s0["translate_misses"] == 2 * len(games)
        assert [_transcript(g) for g in games] == translated
        s2 = dict(engine._STATS)
        assert s2["translate_misses"] == s1["translate_misses"]
        assert s2["translate_disk_hits"] - s1["translate_disk_hits"] == 2 * len(games)

        files[0].write_text(files[0].read_text()[:1000])  # a torn file
        s3 = fresh()
        assert [_transcript(g) for g in games] == translated
        s4 = dict(engine._STATS)
        assert (
            s4["translate_disk_errors"] - s3["translate_disk_errors"],
            s4["translate_misses"] - s3["translate_misses"],
        ) == (1, 1)
        assert json.loads(files[0].read_text())["format"] == 1  # translated again and replaced
    finally:
        engine.uninstall_engine_caches()
        engine.install_engine_caches()


def test_the_parsed_task_holds_what_the_engine_reads_from_the_translated_one(alfworld_games: dict) -> None:
    import fast_downward

    def read(task: Any) -> tuple[Any, ...]:  # what PddlState takes from the task
        return (
            [(a.name, [(p.name, p.type_name) for p in a.parameters]) for a in task.actions],
            [(t.name, tuple(t.supertype_names)) for t in task.types],
            [(o.name, o.type_name) for o in task.objects],
            [str(atom) for atom in task.init],
        )

    original = engine._ORIGINALS["pddl2sas"]
    for split in ("train", "eval_out_of_distribution"):
        for game in alfworld_games[split]:
            data = json.loads(game.path.read_text())
            translated, _ = original(data["pddl_domain"], data["pddl_problem"])
            assert read(engine._parsed_task(data["pddl_domain"], data["pddl_problem"])) == read(translated)
    assert fast_downward.pddl2sas is not original  # the cache stays installed
