"""One rule, one place, held to the code (docs/dev/architecture.md, "The rules the layers
give"): an input's status has one writer, and every message sent names an actor that
exists. Read from the source of every product app (tests/product.py), each check tried on
a synthetic case first, so none of them passes while it misreads the code."""

from __future__ import annotations

import ast
import textwrap

from jobs.dispatch import ACTOR_QUEUES
from tests.product import product_trees, writers

# -- one writer of Input.status -------------------------------------------------------------

INPUT_STATUS_WRITER = "jobs/services/inputs.py"


def _trees(**sources: str) -> list[tuple[str, ast.Module]]:
    return [(name, ast.parse(textwrap.dedent(source))) for name, source in sources.items()]


def test_an_inputs_status_is_written_by_the_inputs_module_alone() -> None:
    """Its moves (awaiting upload, pending, copying, ready, failed, expired) are guarded
    updates in jobs.services.inputs; the purge of an input's data expires it there too."""
    assert writers("Input", {"status"}, related="inputs") == {INPUT_STATUS_WRITER}


def test_the_writer_check_sees_every_way_of_writing_a_status() -> None:
    # given a module per way a status is written, and one that only reads it
    trees = _trees(
        update="Input.objects.filter(pk=1).update(status=InputStatus.EXPIRED)",
        splat="Input.objects.filter(pk=1).update(**fields)",
        related="organization.inputs.filter(pk=1).update(status='failed')",
        defaults="Input.objects.update_or_create(pk=1, defaults={'status': 'ready'})",
        bulk="Input.objects.bulk_update(items, ['status', 'error'])",
        made="Input.objects.create(organization=org, status=InputStatus.PENDING)",
        built="items.append(Input(organization=org, status=InputStatus.READY))",
        assigned="item.status = InputStatus.READY\nitem.save()",
        sql="cursor.execute('UPDATE jobs_input SET status = %s WHERE id = %s', [s, i])",
        reads="Input.objects.filter(status=InputStatus.READY).update(error='')",
        other="Job.objects.filter(pk=1).update(status=JobStatus.DONE)")
    # then each writer is seen, and neither the reader nor another model's writer is
    assert writers("Input", {"status"}, related="inputs", trees=trees) == {
        "update", "splat", "related", "defaults", "bulk", "made", "built", "assigned", "sql"}


# -- every message names an actor -----------------------------------------------------------

SENDS = ("send", "send_on_commit")  # jobs.dispatch's: the actor's name first
DISPATCH = "jobs/dispatch.py"


def sent_names(trees: list[tuple[str, ast.Module]]) -> list[tuple[str, int, str | None]]:
    """Every call of jobs.dispatch's send or send_on_commit in `trees`: its module, its line
    and the actor it names (one entry per branch of a conditional), or None for a name not
    written out at the call. jobs/dispatch.py's own send_on_commit passes its `actor` on."""
    found: list[tuple[str, int, str | None]] = []
    for name, tree in trees:
        modules, functions = _dispatch_names(tree, own=name == DISPATCH)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and _is_send(node.func, modules, functions)):
                continue
            first = node.args[0] if node.args else None
            if name == DISPATCH and isinstance(first, ast.Name) and first.id == "actor":
                continue
            found += [(name, node.lineno, actor) for actor in _literals(first)]
    return found


def _dispatch_names(tree: ast.Module, *, own: bool) -> tuple[set[str], set[str]]:
    """The local names of the jobs.dispatch module, and of its send functions."""
    modules, functions = set(), set(SENDS) if own else set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "jobs":
            modules |= {a.asname or a.name for a in node.names if a.name == "dispatch"}
        elif isinstance(node, ast.ImportFrom) and node.module == "jobs.dispatch":
            functions |= {a.asname or a.name for a in node.names if a.name in SENDS}
        elif isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name == "jobs.dispatch"}
    return modules, functions


def _is_send(func: ast.expr, modules: set[str], functions: set[str]) -> bool:
    if isinstance(func, ast.Name):
        return func.id in functions
    return isinstance(func, ast.Attribute) and func.attr in SENDS \
        and ast.unparse(func.value) in modules


def _literals(node: ast.expr | None) -> list[str | None]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return [*_literals(node.body), *_literals(node.orelse)]
    return [None]


def _unknown(sent: list[tuple[str, int, str | None]]) -> list[str]:
    return [f"{module}:{line}: " + (f"{actor!r} is no actor jobs.dispatch knows"
                                    if actor is not None else "the actor's name is not "
                                    "written out at the call")
            for module, line, actor in sent if actor not in ACTOR_QUEUES]


def test_every_message_sent_names_an_actor_dispatch_knows() -> None:
    """ACTOR_QUEUES is held to the actors the worker declares, on their queues, by
    tests/db/test_dispatch.py; each name a send writes is held to it here."""
    sent = sent_names(list(product_trees()))
    problems = _unknown(sent)
    assert not problems, "\n".join(problems)
    # and every actor dispatch knows is sent somewhere: no entry is left behind
    assert set(ACTOR_QUEUES) - {actor for _module, _line, actor in sent} == set()


def test_the_send_check_sees_every_name_sent() -> None:
    # given sends through each spelling, of known and unknown names
    trees = _trees(
        a="from jobs import dispatch\n"
          "dispatch.send('job_start_task', job_id)\n"
          "dispatch.send_on_commit('job_strat_task', job_id)\n",
        b="from jobs import dispatch as d\n"
          "d.send('input_copy_task' if fresh else 'input_recopy_task', item_id)\n",
        c="from jobs.dispatch import send_on_commit\n"
          "send_on_commit(name, job_id)\n",
        d="import jobs.dispatch\n"
          "jobs.dispatch.send('webhook_task', delivery_id)\n",
        e="from elsewhere import send\n"
          "send('not a dispatch send')\n")
    # then each unknown name is seen, and a name not written out
    assert _unknown(sent_names(trees)) == [
        "a:3: 'job_strat_task' is no actor jobs.dispatch knows",
        "b:2: 'input_recopy_task' is no actor jobs.dispatch knows",
        "c:2: the actor's name is not written out at the call",
        "d:2: 'webhook_task' is no actor jobs.dispatch knows"]
