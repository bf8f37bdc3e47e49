"""A run named as `TrainingFramework` names its runs (`project/model`) takes served rollouts.

Found by the guarantee matrix (tests/matrix/served.py): the start route took one path
segment as the run, so `POST /api/runs/project/model/rollouts` was a 404.
"""

from __future__ import annotations

from typing import Any

import openai
from serving import Served

from artstore.serve.rollouts import rollout_row


async def test_a_run_named_project_slash_model_takes_rollouts(served: Served) -> None:
    for spelled in ("matrix/agent", "matrix%2Fagent"):
        started = await served.start(run=spelled)
        assert started["run"] == "matrix/agent"
        client = openai.AsyncOpenAI(base_url=started["base_url"], api_key=served.upstream.api_key)
        async with client:
            await client.chat.completions.create(
                model="test-model", messages=[{"role": "user", "content": "Lima"}]
            )
        finished = await served.finish(started["rollout_id"], rewards={"reward": 1.0})
        assert finished.status_code == 200, finished.text
        row: Any = await rollout_row(served.store, started["rollout_id"])
        assert (row.run, row.status) == ("matrix/agent", "finished")
