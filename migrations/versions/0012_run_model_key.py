"""v_runs.model_key: the run's model as `project/model`, the name other views give it

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01 18:00:00.000000

`v_runs.model` is the model's name alone (`demo-1`), while `v_train_steps.model`,
`v_train_step_metrics.model` and `v_groups.consumed_by` name a trained model
`project/name` (`artstore-demo/demo-1`), as `artstore runs` and `show` print it. The
new column `model_key` holds that name (the name alone for a run without a project), so
that a query joins a run to its own model's train steps on `model_key = model`. The
meaning of every existing column is unchanged. Only v_runs is recreated (its new column
comes after `model`, which `CREATE OR REPLACE VIEW` cannot do); the other views are as
revision 0009 created them, and the reader role of 0003 may read v_runs again.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_confined = importlib.import_module("artstore.migrations.versions.0003_immutable_exact_confined")
_before = importlib.import_module("artstore.migrations.versions.0009_trained_per_step")

# v_runs as artstore/schema/views.py compiles it at this revision.
V_RUNS: dict[str, str] = {
    "sqlite": "CREATE VIEW v_runs AS\nSELECT runs.run, runs.project, runs.model, CASE WHEN (coalesce(runs.project, '') = '') THEN runs.model ELSE runs.project || '/' || runs.model END AS model_key, runs.base_model, runs.validation_model, runs.scorer, runs.status, runs.trainer, runs.error, runs.num_scenarios, coalesce(rollout_counts.num_rollouts, 0) AS num_rollouts, coalesce(rollout_counts.num_finished, 0) AS num_finished, coalesce(rollout_counts.num_failed, 0) AS num_failed, coalesce(rollout_counts.num_running, 0) AS num_running, coalesce(group_counts.num_groups, 0) AS num_groups, coalesce(step_counts.num_train_steps, 0) AS num_train_steps, step_counts.last_step, token_counts.total_tokens, runs.started_at AS started_at, runs.finished_at AS finished_at, ((CAST(strftime('%s', runs.finished_at) AS INTEGER) - CAST(strftime('%s', runs.started_at) AS INTEGER)) * 1000000 + (CAST(substr(runs.finished_at, 21, 6) AS INTEGER) - CAST(substr(runs.started_at, 21, 6) AS INTEGER))) / 1000000.0 AS duration_s, NULLIF(runs.config, 'null') AS config \nFROM runs LEFT OUTER JOIN (SELECT rollouts.run AS run, count(*) AS num_rollouts, count(CASE WHEN (rollouts.status = 'finished') THEN 1 END) AS num_finished, count(CASE WHEN (rollouts.status = 'failed') THEN 1 END) AS num_failed, count(CASE WHEN (rollouts.status = 'running') THEN 1 END) AS num_running \nFROM rollouts GROUP BY rollouts.run) AS rollout_counts ON rollout_counts.run = runs.run LEFT OUTER JOIN (SELECT rollouts.run AS run, sum(llm_calls.total_tokens) AS total_tokens \nFROM llm_calls JOIN rollouts ON rollouts.rollout_id = llm_calls.rollout_id GROUP BY rollouts.run) AS token_counts ON token_counts.run = runs.run LEFT OUTER JOIN (SELECT groups.run AS run, count(*) AS num_groups \nFROM groups GROUP BY groups.run) AS group_counts ON group_counts.run = runs.run LEFT OUTER JOIN (SELECT train_steps.run AS run, count(*) AS num_train_steps, max(train_steps.step) AS last_step \nFROM train_steps \nWHERE train_steps.status = 'completed' GROUP BY train_steps.run) AS step_counts ON step_counts.run = runs.run",
    "postgresql": "CREATE VIEW v_runs AS\nSELECT runs.run, runs.project, runs.model, CASE WHEN (coalesce(runs.project, '') = '') THEN runs.model ELSE runs.project || '/' || runs.model END AS model_key, runs.base_model, runs.validation_model, runs.scorer, runs.status, runs.trainer, runs.error, runs.num_scenarios, coalesce(rollout_counts.num_rollouts, 0) AS num_rollouts, coalesce(rollout_counts.num_finished, 0) AS num_finished, coalesce(rollout_counts.num_failed, 0) AS num_failed, coalesce(rollout_counts.num_running, 0) AS num_running, coalesce(group_counts.num_groups, 0) AS num_groups, coalesce(step_counts.num_train_steps, 0) AS num_train_steps, step_counts.last_step, token_counts.total_tokens, to_char((runs.started_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') AS started_at, to_char((runs.finished_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') AS finished_at, CAST(EXTRACT(EPOCH FROM (runs.finished_at) - (runs.started_at)) AS DOUBLE PRECISION) AS duration_s, CASE WHEN json_typeof(runs.config) = 'null' THEN NULL ELSE runs.config END AS config \nFROM runs LEFT OUTER JOIN (SELECT rollouts.run AS run, count(*) AS num_rollouts, count(CASE WHEN (rollouts.status = 'finished') THEN 1 END) AS num_finished, count(CASE WHEN (rollouts.status = 'failed') THEN 1 END) AS num_failed, count(CASE WHEN (rollouts.status = 'running') THEN 1 END) AS num_running \nFROM rollouts GROUP BY rollouts.run) AS rollout_counts ON rollout_counts.run = runs.run LEFT OUTER JOIN (SELECT rollouts.run AS run, sum(llm_calls.total_tokens) AS total_tokens \nFROM llm_calls JOIN rollouts ON rollouts.rollout_id = llm_calls.rollout_id GROUP BY rollouts.run) AS token_counts ON token_counts.run = runs.run LEFT OUTER JOIN (SELECT groups.run AS run, count(*) AS num_groups \nFROM groups GROUP BY groups.run) AS group_counts ON group_counts.run = runs.run LEFT OUTER JOIN (SELECT train_steps.run AS run, count(*) AS num_train_steps, max(train_steps.step) AS last_step \nFROM train_steps \nWHERE train_steps.status = 'completed' GROUP BY train_steps.run) AS step_counts ON step_counts.run = runs.run",
}

# Every view at this revision: v_runs new, the others as 0009 created them.
CREATE_VIEWS: dict[str, list[str]] = {
    dialect: [V_RUNS[dialect], *_before.CREATE_VIEWS[dialect][1:]] for dialect in V_RUNS
}


def _recreate_v_runs(statement: str) -> None:
    op.execute("DROP VIEW IF EXISTS v_runs")
    op.execute(statement)
    if op.get_context().dialect.name == "postgresql":
        _confined.grant_reader()  # a recreated view has lost its grants


def upgrade() -> None:
    _recreate_v_runs(V_RUNS[op.get_context().dialect.name])


def downgrade() -> None:
    _recreate_v_runs(_before.CREATE_VIEWS[op.get_context().dialect.name][0])
