"""immutability without holes, exact JSON on PostgreSQL, a role for artstore sql

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 09:00:00.000000

- SQLite: `INSERT OR REPLACE` and `REPLACE INTO` delete the row they collide with, without
  firing DELETE triggers. A BEFORE INSERT trigger on `events` and `blobs` refuses any
  insert whose key is already stored, so that no ordinary statement changes or removes a
  stored event or blob (UPDATE and DELETE were refused since 0001).
- PostgreSQL: JSON columns become `json` (the text exactly as written: key order, and the
  escape \\u0000, which `jsonb` refuses); the views are recreated over them.
- PostgreSQL: appends are ordered by an EXCLUSIVE lock on the empty table `append_lock`,
  taken once per INSERT statement on `events`, instead of an advisory lock that any role
  could take. The table exists on SQLite too (unused: its writer lock is the file's).
- PostgreSQL: the NOLOGIN role `artstore_reader` may read the views and nothing else;
  `artstore sql` runs user queries as it (SET ROLE, in a READ ONLY transaction). A role
  can leave SET ROLE with `set_config('role', ...)`: when this migration runs as a
  superuser it revokes that function from PUBLIC in this database.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

READER_ROLE = "artstore_reader"

JSON_COLUMNS = {
    "events": ["data"],
    "runs": ["config"],
    "rollouts": ["scenario", "result"],
    "llm_calls": ["tool_calls"],
    "rewards": ["metrics"],
    "train_steps": ["group_ids", "metrics"],
    "trajectory_messages": ["tool_calls"],
}

CREATE_VIEWS: dict[str, list[str]] = {
    "sqlite": [
        "CREATE VIEW v_runs AS\nSELECT runs.run, runs.project, runs.model, runs.base_model, runs.validation_model, runs.scorer, runs.status, runs.trainer, runs.error, runs.num_scenarios, coalesce(rollout_counts.num_rollouts, 0) AS num_rollouts, coalesce(rollout_counts.num_finished, 0) AS num_finished, coalesce(rollout_counts.num_failed, 0) AS num_failed, coalesce(rollout_counts.num_running, 0) AS num_running, coalesce(group_counts.num_groups, 0) AS num_groups, coalesce(step_counts.num_train_steps, 0) AS num_train_steps, step_counts.last_step, token_counts.total_tokens, runs.started_at AS started_at, runs.finished_at AS finished_at, ((CAST(strftime('%s', runs.finished_at) AS INTEGER) - CAST(strftime('%s', runs.started_at) AS INTEGER)) * 1000000 + (CAST(substr(runs.finished_at, 21, 6) AS INTEGER) - CAST(substr(runs.started_at, 21, 6) AS INTEGER))) / 1000000.0 AS duration_s, NULLIF(runs.config, 'null') AS config \nFROM runs LEFT OUTER JOIN (SELECT rollouts.run AS run, count(*) AS num_rollouts, count(CASE WHEN (rollouts.status = 'finished') THEN 1 END) AS num_finished, count(CASE WHEN (rollouts.status = 'failed') THEN 1 END) AS num_failed, count(CASE WHEN (rollouts.status = 'running') THEN 1 END) AS num_running \nFROM rollouts GROUP BY rollouts.run) AS rollout_counts ON rollout_counts.run = runs.run LEFT OUTER JOIN (SELECT rollouts.run AS run, sum(llm_calls.total_tokens) AS total_tokens \nFROM llm_calls JOIN rollouts ON rollouts.rollout_id = llm_calls.rollout_id GROUP BY rollouts.run) AS token_counts ON token_counts.run = runs.run LEFT OUTER JOIN (SELECT groups.run AS run, count(*) AS num_groups \nFROM groups GROUP BY groups.run) AS group_counts ON group_counts.run = runs.run LEFT OUTER JOIN (SELECT train_steps.run AS run, count(*) AS num_train_steps, max(train_steps.step) AS last_step \nFROM train_steps \nWHERE train_steps.status = 'completed' GROUP BY train_steps.run) AS step_counts ON step_counts.run = runs.run",
        "CREATE VIEW v_rollouts AS\nSELECT rollouts.rollout_id, rollouts.run, rollouts.group_id, rollouts.scenario_index, rollouts.model, rollouts.role, rollouts.policy_step, rollouts.status, rollouts.error_type, rollouts.error_message, rollouts.num_llm_calls, call_totals.prompt_tokens, call_totals.completion_tokens, call_totals.total_tokens, coalesce(call_totals.num_tool_calls, 0) AS num_tool_calls, call_totals.llm_latency_s, runs.scorer, latest.reward, rollouts.started_at AS started_at, rollouts.finished_at AS finished_at, rollouts.duration_s, CASE WHEN rollouts.imported THEN 1 ELSE 0 END AS imported, NULLIF(rollouts.scenario, 'null') AS scenario, NULLIF(rollouts.result, 'null') AS result \nFROM rollouts LEFT OUTER JOIN runs ON runs.run = rollouts.run LEFT OUTER JOIN (SELECT llm_calls.rollout_id AS rollout_id, sum(llm_calls.prompt_tokens) AS prompt_tokens, sum(llm_calls.completion_tokens) AS completion_tokens, sum(llm_calls.total_tokens) AS total_tokens, sum((CASE WHEN json_type(llm_calls.tool_calls) = 'array' THEN json_array_length(llm_calls.tool_calls) ELSE 0 END)) AS num_tool_calls, sum(llm_calls.latency_s) AS llm_latency_s \nFROM llm_calls GROUP BY llm_calls.rollout_id) AS call_totals ON call_totals.rollout_id = rollouts.rollout_id LEFT OUTER JOIN (SELECT rewards.rollout_id AS rollout_id, rewards.scorer AS scorer, rewards.reward AS reward \nFROM rewards \nWHERE NOT (EXISTS (SELECT * \nFROM rewards AS newer \nWHERE newer.rollout_id = rewards.rollout_id AND newer.scorer = rewards.scorer AND newer.id > rewards.id))) AS latest ON latest.rollout_id = rollouts.rollout_id AND latest.scorer = runs.scorer",
        "CREATE VIEW v_llm_calls AS\nSELECT llm_calls.call_id, llm_calls.rollout_id, rollouts.run, rollouts.group_id, rollouts.policy_step, rollouts.role, llm_calls.call_index, llm_calls.model, llm_calls.prompt_tokens, llm_calls.completion_tokens, llm_calls.total_tokens, llm_calls.latency_s, llm_calls.finish_reason, llm_calls.num_input_messages, (CASE WHEN json_type(llm_calls.tool_calls) = 'array' THEN json_array_length(llm_calls.tool_calls) ELSE 0 END) AS num_tool_calls, (SELECT group_concat(coalesce(json_extract(call_tool.value, '$.name'), json_extract(call_tool.value, '$.function.name')), ', ') AS text_agg_1 \nFROM json_each(CASE WHEN json_type(llm_calls.tool_calls) = 'array' THEN llm_calls.tool_calls ELSE '[]' END) AS call_tool) AS tool_names, CASE WHEN llm_calls.has_logprobs THEN 1 ELSE 0 END AS has_logprobs, llm_calls.error_type, llm_calls.error_message, llm_calls.started_at AS started_at, llm_calls.position, NULLIF(llm_calls.tool_calls, 'null') AS tool_calls \nFROM llm_calls LEFT OUTER JOIN rollouts ON rollouts.rollout_id = llm_calls.rollout_id",
        "CREATE VIEW v_tool_calls AS\nSELECT calls.call_id, calls.rollout_id, rollouts.run, rollouts.policy_step, rollouts.role, calls.call_index, tool.\"key\" AS tool_index, coalesce(json_extract(tool.value, '$.name'), json_extract(tool.value, '$.function.name')) AS tool_name, (CASE WHEN json_type(calls.tool_calls) = 'array' THEN json_array_length(calls.tool_calls) ELSE 0 END) AS num_parallel, calls.latency_s AS call_latency_s, ((CAST(strftime('%s', calls.next_started_at) AS INTEGER) - CAST(strftime('%s', calls.started_at) AS INTEGER)) * 1000000 + (CAST(substr(calls.next_started_at, 21, 6) AS INTEGER) - CAST(substr(calls.started_at, 21, 6) AS INTEGER))) / 1000000.0 - calls.latency_s AS tool_time_s, calls.started_at AS started_at, json_extract(tool.value, '$.args') AS args \nFROM (SELECT llm_calls.call_id AS call_id, llm_calls.rollout_id AS rollout_id, llm_calls.call_index AS call_index, llm_calls.latency_s AS latency_s, llm_calls.started_at AS started_at, llm_calls.tool_calls AS tool_calls, lead(llm_calls.started_at) OVER (PARTITION BY llm_calls.rollout_id ORDER BY llm_calls.call_index) AS next_started_at \nFROM llm_calls) AS calls JOIN json_each(CASE WHEN json_type(calls.tool_calls) = 'array' THEN calls.tool_calls ELSE '[]' END) AS tool ON 1 = 1 LEFT OUTER JOIN rollouts ON rollouts.rollout_id = calls.rollout_id",
        "CREATE VIEW v_rewards AS\nSELECT rewards.rollout_id, rewards.group_id, rollouts.run, rollouts.policy_step, rollouts.role, rewards.scorer, rewards.reward, CASE WHEN rewards.rescored THEN 1 ELSE 0 END AS rescored, CASE WHEN (NOT (EXISTS (SELECT * \nFROM rewards AS newer \nWHERE newer.rollout_id = rewards.rollout_id AND newer.scorer = rewards.scorer AND newer.id > rewards.id))) THEN 1 ELSE 0 END AS is_latest, rewards.recorded_at AS recorded_at, rewards.position, rewards.id, NULLIF(rewards.metrics, 'null') AS metrics \nFROM rewards LEFT OUTER JOIN rollouts ON rollouts.rollout_id = rewards.rollout_id",
        "CREATE VIEW v_latest_rewards AS\nSELECT rewards.rollout_id, rewards.group_id, rollouts.run, rollouts.policy_step, rollouts.role, rewards.scorer, rewards.reward, CASE WHEN rewards.rescored THEN 1 ELSE 0 END AS rescored, (SELECT count(*) AS count_1 \nFROM rewards AS every \nWHERE every.rollout_id = rewards.rollout_id AND every.scorer = rewards.scorer) AS num_scores, rewards.recorded_at AS recorded_at, rewards.position, rewards.id, NULLIF(rewards.metrics, 'null') AS metrics \nFROM rewards LEFT OUTER JOIN rollouts ON rollouts.rollout_id = rewards.rollout_id \nWHERE NOT (EXISTS (SELECT * \nFROM rewards AS newer \nWHERE newer.rollout_id = rewards.rollout_id AND newer.scorer = rewards.scorer AND newer.id > rewards.id))",
        "CREATE VIEW v_groups AS\nSELECT groups.group_id, groups.run, groups.epoch, groups.batch, groups.scenario_index, groups.size, groups.num_validation, groups.num_failed, stats.scorer, coalesce(stats.num_rewards, 0) AS num_rewards, stats.reward_mean, CASE WHEN (stats.reward_max = stats.reward_min) THEN 0.0 ELSE sqrt(spread.variance) END AS reward_std, stats.reward_min, stats.reward_max, stats.validation_reward_mean, (SELECT group_consumptions.model \nFROM group_consumptions \nWHERE group_consumptions.group_id = groups.group_id ORDER BY group_consumptions.position, group_consumptions.model\n LIMIT 1 OFFSET 0) AS consumed_by, (SELECT group_consumptions.step \nFROM group_consumptions \nWHERE group_consumptions.group_id = groups.group_id ORDER BY group_consumptions.position, group_consumptions.model\n LIMIT 1 OFFSET 0) AS consumed_at_step, (SELECT group_consumptions.scorer \nFROM group_consumptions \nWHERE group_consumptions.group_id = groups.group_id ORDER BY group_consumptions.position, group_consumptions.model\n LIMIT 1 OFFSET 0) AS consumed_with_scorer, (SELECT count(*) AS count_1 \nFROM group_consumptions \nWHERE group_consumptions.group_id = groups.group_id) AS num_consumptions, groups.sealed_at AS sealed_at, groups.position \nFROM groups LEFT OUTER JOIN (SELECT latest.group_id AS group_id, latest.scorer AS scorer, count(CASE WHEN (coalesce(latest.role, 'policy') != 'validation') THEN latest.reward END) AS num_rewards, avg(CASE WHEN (coalesce(latest.role, 'policy') != 'validation') THEN latest.reward END) AS reward_mean, min(CASE WHEN (coalesce(latest.role, 'policy') != 'validation') THEN latest.reward END) AS reward_min, max(CASE WHEN (coalesce(latest.role, 'policy') != 'validation') THEN latest.reward END) AS reward_max, avg(CASE WHEN (coalesce(latest.role, 'policy') = 'validation') THEN latest.reward END) AS validation_reward_mean \nFROM (SELECT latest_r.rollout_id AS rollout_id, latest_r.group_id AS group_id, latest_r.scorer AS scorer, latest_r.reward AS reward, latest_ro.role AS role \nFROM rewards AS latest_r LEFT OUTER JOIN rollouts AS latest_ro ON latest_ro.rollout_id = latest_r.rollout_id \nWHERE NOT (EXISTS (SELECT * \nFROM rewards AS newer \nWHERE newer.rollout_id = latest_r.rollout_id AND newer.scorer = latest_r.scorer AND newer.id > latest_r.id))) AS latest GROUP BY latest.group_id, latest.scorer) AS stats ON stats.group_id = groups.group_id LEFT OUTER JOIN (SELECT again.group_id AS group_id, again.scorer AS scorer, avg((again.reward - stats.reward_mean) * (again.reward - stats.reward_mean)) AS variance \nFROM (SELECT again_r.rollout_id AS rollout_id, again_r.group_id AS group_id, again_r.scorer AS scorer, again_r.reward AS reward, again_ro.role AS role \nFROM rewards AS again_r LEFT OUTER JOIN rollouts AS again_ro ON again_ro.rollout_id = again_r.rollout_id \nWHERE NOT (EXISTS (SELECT * \nFROM rewards AS newer \nWHERE newer.rollout_id = again_r.rollout_id AND newer.scorer = again_r.scorer AND newer.id > again_r.id))) AS again JOIN (SELECT latest.group_id AS group_id, latest.scorer AS scorer, count(CASE WHEN (coalesce(latest.role, 'policy') != 'validation') THEN latest.reward END) AS num_rewards, avg(CASE WHEN (coalesce(latest.role, 'policy') != 'validation') THEN latest.reward END) AS reward_mean, min(CASE WHEN (coalesce(latest.role, 'policy') != 'validation') THEN latest.reward END) AS reward_min, max(CASE WHEN (coalesce(latest.role, 'policy') != 'validation') THEN latest.reward END) AS reward_max, avg(CASE WHEN (coalesce(latest.role, 'policy') = 'validation') THEN latest.reward END) AS validation_reward_mean \nFROM (SELECT latest_r.rollout_id AS rollout_id, latest_r.group_id AS group_id, latest_r.scorer AS scorer, latest_r.reward AS reward, latest_ro.role AS role \nFROM rewards AS latest_r LEFT OUTER JOIN rollouts AS latest_ro ON latest_ro.rollout_id = latest_r.rollout_id \nWHERE NOT (EXISTS (SELECT * \nFROM rewards AS newer \nWHERE newer.rollout_id = latest_r.rollout_id AND newer.scorer = latest_r.scorer AND newer.id > latest_r.id))) AS latest GROUP BY latest.group_id, latest.scorer) AS stats ON stats.group_id = again.group_id AND stats.scorer = again.scorer \nWHERE coalesce(again.role, 'policy') != 'validation' GROUP BY again.group_id, again.scorer) AS spread ON spread.group_id = stats.group_id AND spread.scorer = stats.scorer",
        "CREATE VIEW v_train_steps AS\nSELECT train_steps.id, train_steps.run, train_steps.model, train_steps.step_before, train_steps.step, train_steps.status, train_steps.scorer, train_steps.num_groups, coalesce(trained.num_trajectories, 0) AS num_trajectories, trained.reward_mean, train_steps.checkpoint, train_steps.pushed_to, CASE WHEN train_steps.reconciled THEN 1 ELSE 0 END AS reconciled, train_steps.error_type, train_steps.error_message, train_steps.started_at AS started_at, train_steps.finished_at AS finished_at, train_steps.duration_s, NULLIF(train_steps.group_ids, 'null') AS group_ids, NULLIF(train_steps.metrics, 'null') AS metrics \nFROM train_steps LEFT OUTER JOIN (SELECT step.id AS id, count(latest.reward) AS num_trajectories, avg(latest.reward) AS reward_mean \nFROM train_steps AS step JOIN json_each(CASE WHEN json_type(step.group_ids) = 'array' THEN step.group_ids ELSE '[]' END) AS step_group ON 1 = 1 JOIN rollouts AS trained ON trained.group_id = step_group.value AND coalesce(trained.role, 'policy') != 'validation' JOIN (SELECT latest_r.rollout_id AS rollout_id, latest_r.group_id AS group_id, latest_r.scorer AS scorer, latest_r.reward AS reward, latest_ro.role AS role \nFROM rewards AS latest_r LEFT OUTER JOIN rollouts AS latest_ro ON latest_ro.rollout_id = latest_r.rollout_id \nWHERE NOT (EXISTS (SELECT * \nFROM rewards AS newer \nWHERE newer.rollout_id = latest_r.rollout_id AND newer.scorer = latest_r.scorer AND newer.id > latest_r.id))) AS latest ON latest.rollout_id = trained.rollout_id AND latest.scorer = step.scorer GROUP BY step.id) AS trained ON trained.id = train_steps.id",
        "CREATE VIEW v_train_step_metrics AS\nSELECT train_steps.id AS train_step_id, train_steps.run, train_steps.model, train_steps.step, train_steps.status, metric.\"key\" AS metric, (CASE WHEN metric.type IN ('integer', 'real') THEN CAST(metric.value AS DOUBLE PRECISION) WHEN metric.type = 'true' THEN 1.0 WHEN metric.type = 'false' THEN 0.0 END) AS value \nFROM train_steps JOIN json_each(CASE WHEN json_type(train_steps.metrics) = 'object' THEN train_steps.metrics ELSE '{}' END) AS metric ON 1 = 1",
        "CREATE VIEW v_trajectory_messages AS\nSELECT trajectory_messages.rollout_id, rollouts.run, rollouts.policy_step, rollouts.role AS rollout_role, trajectory_messages.history_index, trajectory_messages.message_index, trajectory_messages.role, trajectory_messages.content, CASE WHEN trajectory_messages.trainable THEN 1 ELSE 0 END AS trainable, trajectory_messages.num_logprobs, trajectory_messages.tool_call_id, (CASE WHEN json_type(trajectory_messages.tool_calls) = 'array' THEN json_array_length(trajectory_messages.tool_calls) ELSE 0 END) AS num_tool_calls, (SELECT group_concat(coalesce(json_extract(message_tool.value, '$.name'), json_extract(message_tool.value, '$.function.name')), ', ') AS text_agg_1 \nFROM json_each(CASE WHEN json_type(trajectory_messages.tool_calls) = 'array' THEN trajectory_messages.tool_calls ELSE '[]' END) AS message_tool) AS tool_names, NULLIF(trajectory_messages.tool_calls, 'null') AS tool_calls \nFROM trajectory_messages LEFT OUTER JOIN rollouts ON rollouts.rollout_id = trajectory_messages.rollout_id",
    ],
    "postgresql": [
        "CREATE VIEW v_runs AS\nSELECT runs.run, runs.project, runs.model, runs.base_model, runs.validation_model, runs.scorer, runs.status, runs.trainer, runs.error, runs.num_scenarios, coalesce(rollout_counts.num_rollouts, 0) AS num_rollouts, coalesce(rollout_counts.num_finished, 0) AS num_finished, coalesce(rollout_counts.num_failed, 0) AS num_failed, coalesce(rollout_counts.num_running, 0) AS num_running, coalesce(group_counts.num_groups, 0) AS num_groups, coalesce(step_counts.num_train_steps, 0) AS num_train_steps, step_counts.last_step, token_counts.total_tokens, to_char((runs.started_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') AS started_at, to_char((runs.finished_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') AS finished_at, CAST(EXTRACT(EPOCH FROM (runs.finished_at) - (runs.started_at)) AS DOUBLE PRECISION) AS duration_s, CASE WHEN json_typeof(runs.config) = 'null' THEN NULL ELSE runs.config END AS config \nFROM runs LEFT OUTER JOIN (SELECT rollouts.run AS run, count(*) AS num_rollouts, count(CASE WHEN (rollouts.status = 'finished') THEN 1 END) AS num_finished, count(CASE WHEN (rollouts.status = 'failed') THEN 1 END) AS num_failed, count(CASE WHEN (rollouts.status = 'running') THEN 1 END) AS num_running \nFROM rollouts GROUP BY rollouts.run) AS rollout_counts ON rollout_counts.run = runs.run LEFT OUTER JOIN (SELECT rollouts.run AS run, sum(llm_calls.total_tokens) AS total_tokens \nFROM llm_calls JOIN rollouts ON rollouts.rollout_id = llm_calls.rollout_id GROUP BY rollouts.run) AS token_counts ON token_counts.run = runs.run LEFT OUTER JOIN (SELECT groups.run AS run, count(*) AS num_groups \nFROM groups GROUP BY groups.run) AS group_counts ON group_counts.run = runs.run LEFT OUTER JOIN (SELECT train_steps.run AS run, count(*) AS num_train_steps, max(train_steps.step) AS last_step \nFROM train_steps \nWHERE train_steps.status = 'completed' GROUP BY train_steps.run) AS step_counts ON step_counts.run = runs.run",
        "CREATE VIEW v_rollouts AS\nSELECT rollouts.rollout_id, rollouts.run, rollouts.group_id, rollouts.scenario_index, rollouts.model, rollouts.role, rollouts.policy_step, rollouts.status, rollouts.error_type, rollouts.error_message, rollouts.num_llm_calls, call_totals.prompt_tokens, call_totals.completion_tokens, call_totals.total_tokens, coalesce(call_totals.num_tool_calls, 0) AS num_tool_calls, call_totals.llm_latency_s, runs.scorer, latest.reward, to_char((rollouts.started_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') AS started_at, to_char((rollouts.finished_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') AS finished_at, rollouts.duration_s, CASE WHEN rollouts.imported THEN 1 ELSE 0 END AS imported, CASE WHEN json_typeof(rollouts.scenario) = 'null' THEN NULL ELSE rollouts.scenario END AS scenario, CASE WHEN json_typeof(rollouts.result) = 'null' THEN NULL ELSE rollouts.result END AS result \nFROM rollouts LEFT OUTER JOIN runs ON runs.run = rollouts.run LEFT OUTER JOIN (SELECT llm_calls.rollout_id AS rollout_id, sum(llm_calls.prompt_tokens) AS prompt_tokens, sum(llm_calls.completion_tokens) AS completion_tokens, sum(llm_calls.total_tokens) AS total_tokens, sum((CASE WHEN json_typeof(llm_calls.tool_calls) = 'array' THEN json_array_length(llm_calls.tool_calls) ELSE 0 END)) AS num_tool_calls, sum(llm_calls.latency_s) AS llm_latency_s \nFROM llm_calls GROUP BY llm_calls.rollout_id) AS call_totals ON call_totals.rollout_id = rollouts.rollout_id LEFT OUTER JOIN (SELECT rewards.rollout_id AS rollout_id, rewards.scorer AS scorer, rewards.reward AS reward \nFROM rewards \nWHERE NOT (EXISTS (SELECT * \nFROM rewards AS newer \nWHERE newer.rollout_id = rewards.rollout_id AND newer.scorer = rewards.scorer AND newer.id > rewards.id))) AS latest ON latest.rollout_id = rollouts.rollout_id AND latest.scorer = runs.scorer",
        "CREATE VIEW v_llm_calls AS\nSELECT llm_calls.call_id, llm_calls.rollout_id, rollouts.run, rollouts.group_id, rollouts.policy_step, rollouts.role, llm_calls.call_index, llm_calls.model, llm_calls.prompt_tokens, llm_calls.completion_tokens, llm_calls.total_tokens, llm_calls.latency_s, llm_calls.finish_reason, llm_calls.num_input_messages, (CASE WHEN json_typeof(llm_calls.tool_calls) = 'array' THEN json_array_length(llm_calls.tool_calls) ELSE 0 END) AS num_tool_calls, (SELECT string_agg(coalesce((call_tool.value #>> '{name}'), (call_tool.value #>> '{function,name}')), ', ' ORDER BY (call_tool.ordinality - 1)) AS text_agg_1 \nFROM json_array_elements(CASE WHEN json_typeof(llm_calls.tool_calls) = 'array' THEN llm_calls.tool_calls ELSE '[]'::json END) WITH ORDINALITY AS call_tool) AS tool_names, CASE WHEN llm_calls.has_logprobs THEN 1 ELSE 0 END AS has_logprobs, llm_calls.error_type, llm_calls.error_message, to_char((llm_calls.started_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') AS started_at, llm_calls.position, CASE WHEN json_typeof(llm_calls.tool_calls) = 'null' THEN NULL ELSE llm_calls.tool_calls END AS tool_calls \nFROM llm_calls LEFT OUTER JOIN rollouts ON rollouts.rollout_id = llm_calls.rollout_id",
        "CREATE VIEW v_tool_calls AS\nSELECT calls.call_id, calls.rollout_id, rollouts.run, rollouts.policy_step, rollouts.role, calls.call_index, (tool.ordinality - 1) AS tool_index, coalesce((tool.value #>> '{name}'), (tool.value #>> '{function,name}')) AS tool_name, (CASE WHEN json_typeof(calls.tool_calls) = 'array' THEN json_array_length(calls.tool_calls) ELSE 0 END) AS num_parallel, calls.latency_s AS call_latency_s, CAST(EXTRACT(EPOCH FROM (calls.next_started_at) - (calls.started_at)) AS DOUBLE PRECISION) - calls.latency_s AS tool_time_s, to_char((calls.started_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') AS started_at, CASE WHEN json_typeof((tool.value -> 'args')) = 'null' THEN NULL ELSE (tool.value -> 'args') END AS args \nFROM (SELECT llm_calls.call_id AS call_id, llm_calls.rollout_id AS rollout_id, llm_calls.call_index AS call_index, llm_calls.latency_s AS latency_s, llm_calls.started_at AS started_at, llm_calls.tool_calls AS tool_calls, lead(llm_calls.started_at) OVER (PARTITION BY llm_calls.rollout_id ORDER BY llm_calls.call_index) AS next_started_at \nFROM llm_calls) AS calls JOIN json_array_elements(CASE WHEN json_typeof(calls.tool_calls) = 'array' THEN calls.tool_calls ELSE '[]'::json END) WITH ORDINALITY AS tool ON true LEFT OUTER JOIN rollouts ON rollouts.rollout_id = calls.rollout_id",
        "CREATE VIEW v_rewards AS\nSELECT rewards.rollout_id, rewards.group_id, rollouts.run, rollouts.policy_step, rollouts.role, rewards.scorer, rewards.reward, CASE WHEN rewards.rescored THEN 1 ELSE 0 END AS rescored, CASE WHEN (NOT (EXISTS (SELECT * \nFROM rewards AS newer \nWHERE newer.rollout_id = rewards.rollout_id AND newer.scorer = rewards.scorer AND newer.id > rewards.id))) THEN 1 ELSE 0 END AS is_latest, to_char((rewards.recorded_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') AS recorded_at, rewards.position, rewards.id, CASE WHEN json_typeof(rewards.metrics) = 'null' THEN NULL ELSE rewards.metrics END AS metrics \nFROM rewards LEFT OUTER JOIN rollouts ON rollouts.rollout_id = rewards.rollout_id",
        "CREATE VIEW v_latest_rewards AS\nSELECT rewards.rollout_id, rewards.group_id, rollouts.run, rollouts.policy_step, rollouts.role, rewards.scorer, rewards.reward, CASE WHEN rewards.rescored THEN 1 ELSE 0 END AS rescored, (SELECT count(*) AS count_1 \nFROM rewards AS every \nWHERE every.rollout_id = rewards.rollout_id AND every.scorer = rewards.scorer) AS num_scores, to_char((rewards.recorded_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') AS recorded_at, rewards.position, rewards.id, CASE WHEN json_typeof(rewards.metrics) = 'null' THEN NULL ELSE rewards.metrics END AS metrics \nFROM rewards LEFT OUTER JOIN rollouts ON rollouts.rollout_id = rewards.rollout_id \nWHERE NOT (EXISTS (SELECT * \nFROM rewards AS newer \nWHERE newer.rollout_id = rewards.rollout_id AND newer.scorer = rewards.scorer AND newer.id > rewards.id))",
        "CREATE VIEW v_groups AS\nSELECT groups.group_id, groups.run, groups.epoch, groups.batch, groups.scenario_index, groups.size, groups.num_validation, groups.num_failed, stats.scorer, coalesce(stats.num_rewards, 0) AS num_rewards, stats.reward_mean, CASE WHEN (stats.reward_max = stats.reward_min) THEN 0.0 ELSE sqrt(spread.variance) END AS reward_std, stats.reward_min, stats.reward_max, stats.validation_reward_mean, (SELECT group_consumptions.model \nFROM group_consumptions \nWHERE group_consumptions.group_id = groups.group_id ORDER BY group_consumptions.position, group_consumptions.model \n LIMIT 1) AS consumed_by, (SELECT group_consumptions.step \nFROM group_consumptions \nWHERE group_consumptions.group_id = groups.group_id ORDER BY group_consumptions.position, group_consumptions.model \n LIMIT 1) AS consumed_at_step, (SELECT group_consumptions.scorer \nFROM group_consumptions \nWHERE group_consumptions.group_id = groups.group_id ORDER BY group_consumptions.position, group_consumptions.model \n LIMIT 1) AS consumed_with_scorer, (SELECT count(*) AS count_1 \nFROM group_consumptions \nWHERE group_consumptions.group_id = groups.group_id) AS num_consumptions, to_char((groups.sealed_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') AS sealed_at, groups.position \nFROM groups LEFT OUTER JOIN (SELECT latest.group_id AS group_id, latest.scorer AS scorer, count(CASE WHEN (coalesce(latest.role, 'policy') != 'validation') THEN latest.reward END) AS num_rewards, avg(CASE WHEN (coalesce(latest.role, 'policy') != 'validation') THEN latest.reward END) AS reward_mean, min(CASE WHEN (coalesce(latest.role, 'policy') != 'validation') THEN latest.reward END) AS reward_min, max(CASE WHEN (coalesce(latest.role, 'policy') != 'validation') THEN latest.reward END) AS reward_max, avg(CASE WHEN (coalesce(latest.role, 'policy') = 'validation') THEN latest.reward END) AS validation_reward_mean \nFROM (SELECT latest_r.rollout_id AS rollout_id, latest_r.group_id AS group_id, latest_r.scorer AS scorer, latest_r.reward AS reward, latest_ro.role AS role \nFROM rewards AS latest_r LEFT OUTER JOIN rollouts AS latest_ro ON latest_ro.rollout_id = latest_r.rollout_id \nWHERE NOT (EXISTS (SELECT * \nFROM rewards AS newer \nWHERE newer.rollout_id = latest_r.rollout_id AND newer.scorer = latest_r.scorer AND newer.id > latest_r.id))) AS latest GROUP BY latest.group_id, latest.scorer) AS stats ON stats.group_id = groups.group_id LEFT OUTER JOIN (SELECT again.group_id AS group_id, again.scorer AS scorer, avg((again.reward - stats.reward_mean) * (again.reward - stats.reward_mean)) AS variance \nFROM (SELECT again_r.rollout_id AS rollout_id, again_r.group_id AS group_id, again_r.scorer AS scorer, again_r.reward AS reward, again_ro.role AS role \nFROM rewards AS again_r LEFT OUTER JOIN rollouts AS again_ro ON again_ro.rollout_id = again_r.rollout_id \nWHERE NOT (EXISTS (SELECT * \nFROM rewards AS newer \nWHERE newer.rollout_id = again_r.rollout_id AND newer.scorer = again_r.scorer AND newer.id > again_r.id))) AS again JOIN (SELECT latest.group_id AS group_id, latest.scorer AS scorer, count(CASE WHEN (coalesce(latest.role, 'policy') != 'validation') THEN latest.reward END) AS num_rewards, avg(CASE WHEN (coalesce(latest.role, 'policy') != 'validation') THEN latest.reward END) AS reward_mean, min(CASE WHEN (coalesce(latest.role, 'policy') != 'validation') THEN latest.reward END) AS reward_min, max(CASE WHEN (coalesce(latest.role, 'policy') != 'validation') THEN latest.reward END) AS reward_max, avg(CASE WHEN (coalesce(latest.role, 'policy') = 'validation') THEN latest.reward END) AS validation_reward_mean \nFROM (SELECT latest_r.rollout_id AS rollout_id, latest_r.group_id AS group_id, latest_r.scorer AS scorer, latest_r.reward AS reward, latest_ro.role AS role \nFROM rewards AS latest_r LEFT OUTER JOIN rollouts AS latest_ro ON latest_ro.rollout_id = latest_r.rollout_id \nWHERE NOT (EXISTS (SELECT * \nFROM rewards AS newer \nWHERE newer.rollout_id = latest_r.rollout_id AND newer.scorer = latest_r.scorer AND newer.id > latest_r.id))) AS latest GROUP BY latest.group_id, latest.scorer) AS stats ON stats.group_id = again.group_id AND stats.scorer = again.scorer \nWHERE coalesce(again.role, 'policy') != 'validation' GROUP BY again.group_id, again.scorer) AS spread ON spread.group_id = stats.group_id AND spread.scorer = stats.scorer",
        "CREATE VIEW v_train_steps AS\nSELECT train_steps.id, train_steps.run, train_steps.model, train_steps.step_before, train_steps.step, train_steps.status, train_steps.scorer, train_steps.num_groups, coalesce(trained.num_trajectories, 0) AS num_trajectories, trained.reward_mean, train_steps.checkpoint, train_steps.pushed_to, CASE WHEN train_steps.reconciled THEN 1 ELSE 0 END AS reconciled, train_steps.error_type, train_steps.error_message, to_char((train_steps.started_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') AS started_at, to_char((train_steps.finished_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') AS finished_at, train_steps.duration_s, CASE WHEN json_typeof(train_steps.group_ids) = 'null' THEN NULL ELSE train_steps.group_ids END AS group_ids, CASE WHEN json_typeof(train_steps.metrics) = 'null' THEN NULL ELSE train_steps.metrics END AS metrics \nFROM train_steps LEFT OUTER JOIN (SELECT step.id AS id, count(latest.reward) AS num_trajectories, avg(latest.reward) AS reward_mean \nFROM train_steps AS step JOIN json_array_elements(CASE WHEN json_typeof(step.group_ids) = 'array' THEN step.group_ids ELSE '[]'::json END) WITH ORDINALITY AS step_group ON true JOIN rollouts AS trained ON trained.group_id = (step_group.value #>> '{}') AND coalesce(trained.role, 'policy') != 'validation' JOIN (SELECT latest_r.rollout_id AS rollout_id, latest_r.group_id AS group_id, latest_r.scorer AS scorer, latest_r.reward AS reward, latest_ro.role AS role \nFROM rewards AS latest_r LEFT OUTER JOIN rollouts AS latest_ro ON latest_ro.rollout_id = latest_r.rollout_id \nWHERE NOT (EXISTS (SELECT * \nFROM rewards AS newer \nWHERE newer.rollout_id = latest_r.rollout_id AND newer.scorer = latest_r.scorer AND newer.id > latest_r.id))) AS latest ON latest.rollout_id = trained.rollout_id AND latest.scorer = step.scorer GROUP BY step.id) AS trained ON trained.id = train_steps.id",
        "CREATE VIEW v_train_step_metrics AS\nSELECT train_steps.id AS train_step_id, train_steps.run, train_steps.model, train_steps.step, train_steps.status, metric.key AS metric, (CASE json_typeof(metric.value) WHEN 'number' THEN CAST(metric.value #>> '{}' AS DOUBLE PRECISION) WHEN 'boolean' THEN CASE WHEN CAST(metric.value AS TEXT) = 'true' THEN 1.0 ELSE 0.0 END END) AS value \nFROM train_steps JOIN json_each(CASE WHEN json_typeof(train_steps.metrics) = 'object' THEN train_steps.metrics ELSE '{}'::json END) AS metric ON true",
        "CREATE VIEW v_trajectory_messages AS\nSELECT trajectory_messages.rollout_id, rollouts.run, rollouts.policy_step, rollouts.role AS rollout_role, trajectory_messages.history_index, trajectory_messages.message_index, trajectory_messages.role, trajectory_messages.content, CASE WHEN trajectory_messages.trainable THEN 1 ELSE 0 END AS trainable, trajectory_messages.num_logprobs, trajectory_messages.tool_call_id, (CASE WHEN json_typeof(trajectory_messages.tool_calls) = 'array' THEN json_array_length(trajectory_messages.tool_calls) ELSE 0 END) AS num_tool_calls, (SELECT string_agg(coalesce((message_tool.value #>> '{name}'), (message_tool.value #>> '{function,name}')), ', ' ORDER BY (message_tool.ordinality - 1)) AS text_agg_1 \nFROM json_array_elements(CASE WHEN json_typeof(trajectory_messages.tool_calls) = 'array' THEN trajectory_messages.tool_calls ELSE '[]'::json END) WITH ORDINALITY AS message_tool) AS tool_names, CASE WHEN json_typeof(trajectory_messages.tool_calls) = 'null' THEN NULL ELSE trajectory_messages.tool_calls END AS tool_calls \nFROM trajectory_messages LEFT OUTER JOIN rollouts ON rollouts.rollout_id = trajectory_messages.rollout_id",
    ],
}

DROP_VIEWS: list[str] = [
    "DROP VIEW IF EXISTS v_trajectory_messages",
    "DROP VIEW IF EXISTS v_train_step_metrics",
    "DROP VIEW IF EXISTS v_train_steps",
    "DROP VIEW IF EXISTS v_groups",
    "DROP VIEW IF EXISTS v_latest_rewards",
    "DROP VIEW IF EXISTS v_rewards",
    "DROP VIEW IF EXISTS v_tool_calls",
    "DROP VIEW IF EXISTS v_llm_calls",
    "DROP VIEW IF EXISTS v_rollouts",
    "DROP VIEW IF EXISTS v_runs",
]
VIEW_NAMES = [statement.rsplit(" ", 1)[1] for statement in DROP_VIEWS]


def upgrade() -> None:
    dialect = op.get_context().dialect.name
    for statement in DROP_VIEWS:
        op.execute(statement)
    op.create_table("append_lock", sa.Column("id", sa.Integer(), primary_key=True))
    if dialect == "postgresql":
        _upgrade_postgresql()
    else:
        _upgrade_sqlite()
    for statement in CREATE_VIEWS[dialect]:
        op.execute(statement)
    if dialect == "postgresql":
        _create_reader_role()


def _upgrade_sqlite() -> None:
    # One EXISTS per unique key, so that each is an index lookup.
    keys = {
        "events": [
            "position = NEW.position",
            "event_id = NEW.event_id",
            "stream_id = NEW.stream_id AND version = NEW.version",
        ],
        "blobs": ["hash = NEW.hash"],
    }
    for table, conditions in keys.items():
        stored = " OR ".join(
            f"EXISTS (SELECT 1 FROM {table} WHERE {condition})" for condition in conditions
        )
        op.execute(
            f"CREATE TRIGGER {table}_refuse_replace BEFORE INSERT ON {table} WHEN {stored} "
            f"BEGIN SELECT RAISE(ABORT, 'artstore: {table} are immutable, an INSERT over a "
            "stored row (REPLACE) refused'); END"
        )


def _upgrade_postgresql() -> None:
    for table, columns in JSON_COLUMNS.items():
        for column in columns:
            op.execute(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE json USING {column}::json")
    op.execute("REVOKE ALL ON append_lock FROM PUBLIC")
    op.execute(
        """
        CREATE FUNCTION artstore_lock_appends() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            LOCK TABLE append_lock IN EXCLUSIVE MODE;
            RETURN NULL;
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER events_lock_appends BEFORE INSERT ON events "
        "FOR EACH STATEMENT EXECUTE FUNCTION artstore_lock_appends()"
    )
    # Positions still come from the sequence row by row, now under the statement's lock.
    op.execute(
        """
        CREATE OR REPLACE FUNCTION artstore_assign_position() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            NEW.position := nextval('events_position_seq');
            RETURN NEW;
        END $$
        """
    )


def _create_reader_role() -> None:
    # Roles belong to the whole server: the role may exist already (another store), and
    # a user who may not create roles migrates all the same (artstore sql then says the
    # role is missing, and a user who may creates it with `artstore db upgrade`).
    op.execute(
        f"""
        DO $$
        BEGIN
            IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{READER_ROLE}') THEN
                CREATE ROLE {READER_ROLE} NOLOGIN;
            END IF;
        EXCEPTION
            WHEN duplicate_object OR unique_violation THEN
                NULL;  -- created meanwhile by the migration of another database
            WHEN insufficient_privilege THEN
                RAISE NOTICE 'artstore: cannot create role {READER_ROLE}; artstore sql will not run';
        END $$
        """
    )
    bind = op.get_bind()
    if bind.execute(sa.text(f"SELECT to_regrole('{READER_ROLE}') IS NULL")).scalar():
        return
    superuser = bind.execute(
        sa.text("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
    ).scalar()
    if not superuser:  # SET ROLE needs membership, except for a superuser
        op.execute(
            f"""
            DO $$
            BEGIN
                GRANT {READER_ROLE} TO CURRENT_USER;
            EXCEPTION WHEN insufficient_privilege THEN
                RAISE NOTICE 'artstore: cannot grant {READER_ROLE} to the store''s user';
            END $$
            """
        )
    grant_reader()
    if superuser:
        # Without this, `SELECT set_config('role', 'none', true)` leaves the reader role.
        op.execute(
            "REVOKE EXECUTE ON FUNCTION pg_catalog.set_config(text, text, boolean) FROM PUBLIC"
        )


def grant_reader() -> None:
    """Let the reader role read the views (again: recreating a view drops its grants).

    Later revisions that recreate the views call this too.
    """
    if op.get_bind().execute(sa.text(f"SELECT to_regrole('{READER_ROLE}') IS NULL")).scalar():
        return
    op.execute(f"GRANT USAGE ON SCHEMA public TO {READER_ROLE}")
    for view in VIEW_NAMES:
        op.execute(f"GRANT SELECT ON {view} TO {READER_ROLE}")


def downgrade() -> None:
    dialect = op.get_context().dialect.name
    for statement in DROP_VIEWS:
        op.execute(statement)
    if dialect == "postgresql":
        superuser = (
            op.get_bind()
            .execute(sa.text("SELECT rolsuper FROM pg_roles WHERE rolname = current_user"))
            .scalar()
        )
        if superuser:
            op.execute(
                "GRANT EXECUTE ON FUNCTION pg_catalog.set_config(text, text, boolean) TO PUBLIC"
            )
        if (
            op.get_bind()
            .execute(sa.text(f"SELECT to_regrole('{READER_ROLE}') IS NOT NULL"))
            .scalar()
        ):
            op.execute(f"REVOKE USAGE ON SCHEMA public FROM {READER_ROLE}")
        op.execute("DROP TRIGGER IF EXISTS events_lock_appends ON events")
        op.execute("DROP FUNCTION IF EXISTS artstore_lock_appends()")
        op.execute(
            """
            CREATE OR REPLACE FUNCTION artstore_assign_position() RETURNS trigger
            LANGUAGE plpgsql AS $$
            BEGIN
                PERFORM pg_advisory_xact_lock(7021802808247546469);
                NEW.position := nextval('events_position_seq');
                RETURN NEW;
            END $$
            """
        )
        for table, columns in JSON_COLUMNS.items():
            for column in columns:
                op.execute(
                    f"ALTER TABLE {table} ALTER COLUMN {column} TYPE jsonb USING {column}::jsonb"
                )
    else:
        for table in ("events", "blobs"):
            op.execute(f"DROP TRIGGER IF EXISTS {table}_refuse_replace")
    op.drop_table("append_lock")
    previous = importlib.import_module("artstore.migrations.versions.0002_views")
    for statement in previous.CREATE_VIEWS[dialect]:
        op.execute(statement)
