"""The engine caches' command memo: it answers only what the stock derivation would."""

from __future__ import annotations

from typing import Any

import pytest

from memprism_ray.envs.alfworld import engine


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
    assert engine.engine_caches_installed() and textgen.ContextSensitiveGrammar.derive is not stock
    first = grammar.derive(template, context)
    assert first == stock(grammar, template, context) and first.startswith("go to ")
    hits = engine.engine_cache_stats()["command_hits"]
    assert grammar.derive(template, context) == first
    assert engine.engine_cache_stats()["command_hits"] == hits + 1

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
