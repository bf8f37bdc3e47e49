"""Any Unicode text, NUL and lone surrogates included, is stored and read back exactly,
on both databases.

PostgreSQL's `text` cannot hold NUL and `jsonb` refuses the escape \\u0000: artstore keeps
every JSON document as `json` (text exactly as written), so the event log and the blobs
hold it on both databases. The projection tables show U+FFFD where their text columns,
or the JSON the views take apart, would hold a NUL; everything artstore gives back
(trajectories, events, exports) comes from the event log.
"""

from __future__ import annotations

import json

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from sqlalchemy import func, select

from artstore.analysis import query
from artstore.errors import InvalidEventError
from artstore.events import RunFinished
from artstore.schema import tables as t
from artstore.testing.inference_server import token_logprobs

NUL = "\x00"


def answer(text: str, **fields) -> AIMessage:
    logprobs = {"content": token_logprobs(text), "refusal": None}
    metadata = {"logprobs": logprobs, "finish_reason": "stop", "model_name": "test-model"}
    return AIMessage(content=text, response_metadata=metadata, **fields)


async def record(store, rollout_id: str = "nul") -> None:
    system = SystemMessage(f"rules{NUL}here")
    user = HumanMessage(f"find {NUL} bytes")
    asked = answer("", tool_calls=[{"id": "c1", "name": "grep", "args": {"pattern": f"a{NUL}b"}}])
    tool = ToolMessage(f"found{NUL}it", tool_call_id="c1")
    scenario = {"question": f"q{NUL}", "nested": [{"key": NUL}]}
    async with store.rollout("agent", scenario=scenario, rollout_id=rollout_id) as rollout:
        rollout.record_llm_call([system, user], asked)
        rollout.record_llm_call([system, user, asked, tool], answer(f"done{NUL}."))
        rollout.result = {"answer": f"done{NUL}."}
        rollout.metadata["note"] = f"meta{NUL}data"
        rollout.log(f"log{NUL}line")


async def test_nul_in_every_field_round_trips_exactly(store):
    await record(store)
    started, *_, finished = await store.read_stream("rollout-nul")
    assert started.data["scenario"] == {"question": f"q{NUL}", "nested": [{"key": NUL}]}
    assert finished.data["result"] == {"answer": f"done{NUL}."}
    assert finished.data["metadata"] == {"note": f"meta{NUL}data"}
    assert finished.data["logs"] == [f"log{NUL}line"]

    trajectory = await store.trajectory("nul")
    messages = trajectory.messages_and_choices
    assert [m["content"] for m in messages[:2]] == [f"rules{NUL}here", f"find {NUL} bytes"]
    call = messages[2].message.tool_calls[0]
    assert json.loads(call.function.arguments) == {"pattern": f"a{NUL}b"}
    assert messages[3]["content"] == f"found{NUL}it"
    assert messages[4].message.content == f"done{NUL}."
    assert trajectory.metadata == {"note": f"meta{NUL}data"}
    assert trajectory.logs == [f"log{NUL}line"]


async def test_content_addressing_stays_with_nul(store):
    await record(store, "one")
    await record(store, "two")  # the same messages again: no new blob
    async with store.database.read() as connection:
        count = (await connection.execute(select(func.count()).select_from(t.blobs))).scalar()
    await record(store, "three")
    async with store.database.read() as connection:
        again = (await connection.execute(select(func.count()).select_from(t.blobs))).scalar()
    assert count == again


async def test_the_views_read_a_rollout_with_nul(store):
    await record(store)
    scenario, result = (await query(store, "SELECT scenario, result FROM v_rollouts")).rows[0]
    assert json.loads(scenario)["question"] == f"q{NUL}"  # JSON columns keep it, escaped
    assert json.loads(result) == {"answer": f"done{NUL}."}
    ((tool_name, args),) = (await query(store, "SELECT tool_name, args FROM v_tool_calls")).rows
    assert (tool_name, json.loads(args)) == ("grep", {"pattern": "a\ufffdb"})
    contents = await query(
        store, "SELECT content FROM v_trajectory_messages ORDER BY message_index"
    )
    assert [row[0] for row in contents.rows] == [
        "rules\ufffdhere",
        "find \ufffd bytes",
        "",
        "found\ufffdit",
        "done\ufffd.",
    ]
    assert await store.rebuild_projections() > 0  # projections rebuild from the log alone
    assert (await query(store, "SELECT count(*) FROM v_trajectory_messages")).rows == [(5,)]


async def test_a_stream_id_with_nul_is_refused_alone(store):
    with pytest.raises(InvalidEventError, match="NUL"):
        await store.append(f"run-{NUL}", [RunFinished(run="x")])
    await store.append("run-fine", [RunFinished(run="x")])
    assert len(await store.read_all()) == 1


async def test_a_lone_surrogate_in_a_message_is_stored_and_read_back_exactly(store):
    """A tool that lists files gives names decoded with surrogateescape: text that UTF-8
    cannot hold. The call is recorded, its messages read back exactly; the projection's
    text columns show U+FFFD in its place, as for NUL."""
    name = b"report-\xff.txt".decode("utf-8", "surrogateescape")
    asked = answer("", tool_calls=[{"id": "c1", "name": "ls", "args": {"path": name}}])
    tool = ToolMessage(f"found {name}", tool_call_id="c1")
    user = HumanMessage(f"open {name}")
    async with store.rollout("agent", rollout_id="odd") as rollout:
        rollout.record_llm_call([user], asked)
        rollout.record_llm_call([user, asked, tool], answer("done."))
    trajectory = await store.trajectory("odd")
    messages = trajectory.messages_and_choices
    assert messages[0]["content"] == f"open {name}"
    call = messages[1].message.tool_calls[0]
    assert json.loads(call.function.arguments) == {"path": name}
    assert messages[2]["content"] == f"found {name}"
    rows = (await query(store, "SELECT role, content FROM v_trajectory_messages")).rows
    assert ("tool", "found report-\ufffd.txt") in [tuple(row) for row in rows]
    for view in ("v_llm_calls", "v_tool_calls", "v_rollouts"):  # the views read it
        assert (await query(store, f"SELECT * FROM {view}")).rows, view

    # The viewer's page of the trajectory: UTF-8 cannot hold the surrogate, U+FFFD shows.
    import httpx

    from artstore.viewer.server import BackgroundViewer

    with BackgroundViewer(str(store.database.url)) as viewer:
        async with httpx.AsyncClient(base_url=viewer.address) as client:
            page = await client.get("/trajectories/odd")
    assert page.status_code == 200 and "found report-\ufffd.txt" in page.text


def test_a_message_with_a_lone_surrogate_is_written_as_other_messages_are():
    """Its text is UTF-8 but for the surrogate's escape: it reads back as the same message,
    and redaction finds a secret in it, non-ASCII ones too."""
    from artstore.documents import messages as lc
    from artstore.redaction import Redactor

    secret = "pässwört-geheim-42"
    odd = HumanMessage(f"odd \udcff, key {secret}")
    text = lc.dump_message(odd)
    assert "\\udcff" in text and "pässwört" in text
    assert lc.load_message(text) == odd
    assert secret not in Redactor([secret])(text)
    plain = lc.dump_message(HumanMessage(f"plain, key {secret}"))
    assert json.loads(text)["data"].keys() == json.loads(plain)["data"].keys()
