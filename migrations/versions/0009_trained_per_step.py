"""what each train step trained and each rollout's reward, kept; per-step indexes

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 14:30:00.000000

`train_steps` gets `num_trajectories` and `reward_mean` (the policy rollouts of its groups
with a latest reward by its scorer: their count and mean), which v_train_steps read from
a join of every rollout and latest reward at each query; `train_step_groups` lists the
groups each step names, so that a new reward finds the steps it changes
(artstore/projections/trained.py). `rollouts.reward` keeps the latest reward by the run's
scorer, which v_rollouts looked up in `latest_rewards` for every rollout
(artstore/projections/rollout_rewards.py). All are backfilled here with the joins the views
made.
`ix_llm_calls_untimed` holds the calls without a latency (tokens_per_step.sql counts
them) and `ix_rollouts_run_policy_step` covers what the per-step questions read of a
rollout. The views' columns and values are unchanged; they are recreated as
artstore/schema/views.py compiled them at this revision, and the reader role of 0003 may
read them again.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The revisions before: their views (for a downgrade) and the grants to the reader role.
_confined = importlib.import_module("artstore.migrations.versions.0003_immutable_exact_confined")
_http_calls = importlib.import_module("artstore.migrations.versions.0004_http_calls")
_analysis = importlib.import_module("artstore.migrations.versions.0006_analysis_projections")

# A step's groups, one row each (the view's expansion of `group_ids`), per database.
STEP_GROUPS = {
    "sqlite": "json_each(CASE WHEN json_type(train_steps.group_ids) = 'array' "
    "THEN train_steps.group_ids ELSE '[]' END) AS g",
    "postgresql": "json_array_elements(CASE WHEN json_typeof(train_steps.group_ids) = 'array' "
    "THEN train_steps.group_ids ELSE '[]'::json END) AS g",
}
GROUP_TEXT = {"sqlite": "g.value", "postgresql": "(g.value #>> '{}')"}

CREATE_VIEWS: dict[str, list[str]] = {
    "sqlite": [
        "CREATE VIEW v_runs AS\nSELECT runs.run, runs.project, runs.model, runs.base_model, runs.validation_model, runs.scorer, runs.status, runs.trainer, runs.error, runs.num_scenarios, coalesce(rollout_counts.num_rollouts, 0) AS num_rollouts, coalesce(rollout_counts.num_finished, 0) AS num_finished, coalesce(rollout_counts.num_failed, 0) AS num_failed, coalesce(rollout_counts.num_running, 0) AS num_running, coalesce(group_counts.num_groups, 0) AS num_groups, coalesce(step_counts.num_train_steps, 0) AS num_train_steps, step_counts.last_step, token_counts.total_tokens, runs.started_at AS started_at, runs.finished_at AS finished_at, ((CAST(strftime('%s', runs.finished_at) AS INTEGER) - CAST(strftime('%s', runs.started_at) AS INTEGER)) * 1000000 + (CAST(substr(runs.finished_at, 21, 6) AS INTEGER) - CAST(substr(runs.started_at, 21, 6) AS INTEGER))) / 1000000.0 AS duration_s, NULLIF(runs.config, 'null') AS config \nFROM runs LEFT OUTER JOIN (SELECT rollouts.run AS run, count(*) AS num_rollouts, count(CASE WHEN (rollouts.status = 'finished') THEN 1 END) AS num_finished, count(CASE WHEN (rollouts.status = 'failed') THEN 1 END) AS num_failed, count(CASE WHEN (rollouts.status = 'running') THEN 1 END) AS num_running \nFROM rollouts GROUP BY rollouts.run) AS rollout_counts ON rollout_counts.run = runs.run LEFT OUTER JOIN (SELECT rollouts.run AS run, sum(llm_calls.total_tokens) AS total_tokens \nFROM llm_calls JOIN rollouts ON rollouts.rollout_id = llm_calls.rollout_id GROUP BY rollouts.run) AS token_counts ON token_counts.run = runs.run LEFT OUTER JOIN (SELECT groups.run AS run, count(*) AS num_groups \nFROM groups GROUP BY groups.run) AS group_counts ON group_counts.run = runs.run LEFT OUTER JOIN (SELECT train_steps.run AS run, count(*) AS num_train_steps, max(train_steps.step) AS last_step \nFROM train_steps \nWHERE train_steps.status = 'completed' GROUP BY train_steps.run) AS step_counts ON step_counts.run = runs.run",
        "CREATE VIEW v_rollouts AS\nSELECT rollouts.rollout_id, rollouts.run, rollouts.group_id, rollouts.scenario_index, rollouts.model, rollouts.role, rollouts.policy_step, rollouts.status, rollouts.error_type, rollouts.error_message, rollouts.num_llm_calls, rollouts.prompt_tokens, rollouts.completion_tokens, rollouts.total_tokens, rollouts.num_tool_calls, rollouts.llm_latency_s, runs.scorer, rollouts.reward, rollouts.started_at AS started_at, rollouts.finished_at AS finished_at, rollouts.duration_s, CASE WHEN rollouts.imported THEN 1 ELSE 0 END AS imported, NULLIF(rollouts.scenario, 'null') AS scenario, NULLIF(rollouts.result, 'null') AS result \nFROM rollouts LEFT OUTER JOIN runs ON runs.run = rollouts.run",
        "CREATE VIEW v_llm_calls AS\nSELECT llm_calls.call_id, llm_calls.rollout_id, rollouts.run, rollouts.group_id, rollouts.policy_step, rollouts.role, llm_calls.call_index, llm_calls.model, llm_calls.prompt_tokens, llm_calls.completion_tokens, llm_calls.total_tokens, llm_calls.latency_s, llm_calls.finish_reason, llm_calls.num_input_messages, (CASE WHEN json_type(llm_calls.tool_calls) = 'array' THEN json_array_length(llm_calls.tool_calls) ELSE 0 END) AS num_tool_calls, (SELECT group_concat(coalesce(json_extract(call_tool.value, '$.name'), json_extract(call_tool.value, '$.function.name')), ', ') AS text_agg_1 \nFROM json_each(CASE WHEN json_type(llm_calls.tool_calls) = 'array' THEN llm_calls.tool_calls ELSE '[]' END) AS call_tool) AS tool_names, CASE WHEN llm_calls.has_logprobs THEN 1 ELSE 0 END AS has_logprobs, llm_calls.error_type, llm_calls.error_message, llm_calls.started_at AS started_at, llm_calls.position, NULLIF(llm_calls.tool_calls, 'null') AS tool_calls, llm_calls.source, llm_calls.endpoint, CASE WHEN llm_calls.streamed THEN 1 ELSE 0 END AS streamed, CASE WHEN llm_calls.art_exchange THEN 1 ELSE 0 END AS art_exchange \nFROM llm_calls LEFT OUTER JOIN rollouts ON rollouts.rollout_id = llm_calls.rollout_id",
        "CREATE VIEW v_tool_calls AS\nSELECT calls.call_id, calls.rollout_id, rollouts.run, rollouts.policy_step, rollouts.role, calls.call_index, tool.\"key\" AS tool_index, coalesce(json_extract(tool.value, '$.name'), json_extract(tool.value, '$.function.name')) AS tool_name, (CASE WHEN json_type(calls.tool_calls) = 'array' THEN json_array_length(calls.tool_calls) ELSE 0 END) AS num_parallel, calls.latency_s AS call_latency_s, ((CAST(strftime('%s', calls.next_started_at) AS INTEGER) - CAST(strftime('%s', calls.started_at) AS INTEGER)) * 1000000 + (CAST(substr(calls.next_started_at, 21, 6) AS INTEGER) - CAST(substr(calls.started_at, 21, 6) AS INTEGER))) / 1000000.0 - calls.latency_s AS tool_time_s, calls.started_at AS started_at, json_extract(tool.value, '$.args') AS args \nFROM (SELECT llm_calls.call_id AS call_id, llm_calls.rollout_id AS rollout_id, llm_calls.call_index AS call_index, llm_calls.latency_s AS latency_s, llm_calls.started_at AS started_at, llm_calls.tool_calls AS tool_calls, lead(llm_calls.started_at) OVER (PARTITION BY llm_calls.rollout_id ORDER BY llm_calls.call_index) AS next_started_at \nFROM llm_calls) AS calls JOIN json_each(CASE WHEN json_type(calls.tool_calls) = 'array' THEN calls.tool_calls ELSE '[]' END) AS tool ON 1 = 1 LEFT OUTER JOIN rollouts ON rollouts.rollout_id = calls.rollout_id",
        "CREATE VIEW v_rewards AS\nSELECT rewards.rollout_id, rewards.group_id, rollouts.run, rollouts.policy_step, rollouts.role, rewards.scorer, rewards.reward, CASE WHEN rewards.rescored THEN 1 ELSE 0 END AS rescored, CASE WHEN (EXISTS (SELECT * \nFROM latest_rewards \nWHERE latest_rewards.rollout_id = rewards.rollout_id AND latest_rewards.scorer = rewards.scorer AND latest_rewards.position = rewards.position)) THEN 1 ELSE 0 END AS is_latest, rewards.recorded_at AS recorded_at, rewards.position, rewards.id, NULLIF(rewards.metrics, 'null') AS metrics \nFROM rewards LEFT OUTER JOIN rollouts ON rollouts.rollout_id = rewards.rollout_id",
        "CREATE VIEW v_latest_rewards AS\nSELECT rewards.rollout_id, rewards.group_id, rollouts.run, rollouts.policy_step, rollouts.role, rewards.scorer, rewards.reward, CASE WHEN rewards.rescored THEN 1 ELSE 0 END AS rescored, (SELECT count(*) AS count_1 \nFROM rewards AS every \nWHERE every.rollout_id = rewards.rollout_id AND every.scorer = rewards.scorer) AS num_scores, rewards.recorded_at AS recorded_at, rewards.position, rewards.id, NULLIF(rewards.metrics, 'null') AS metrics \nFROM rewards LEFT OUTER JOIN rollouts ON rollouts.rollout_id = rewards.rollout_id \nWHERE EXISTS (SELECT * \nFROM latest_rewards \nWHERE latest_rewards.rollout_id = rewards.rollout_id AND latest_rewards.scorer = rewards.scorer AND latest_rewards.position = rewards.position)",
        "CREATE VIEW v_groups AS\nSELECT groups.group_id, groups.run, groups.epoch, groups.batch, groups.scenario_index, groups.size, groups.num_validation, groups.num_failed, stats.scorer, coalesce(stats.num_rewards, 0) AS num_rewards, stats.reward_mean, CASE WHEN (stats.reward_max = stats.reward_min) THEN 0.0 ELSE sqrt(spread.variance) END AS reward_std, stats.reward_min, stats.reward_max, stats.validation_reward_mean, (SELECT group_consumptions.model \nFROM group_consumptions \nWHERE group_consumptions.group_id = groups.group_id ORDER BY group_consumptions.position, group_consumptions.model\n LIMIT 1 OFFSET 0) AS consumed_by, (SELECT group_consumptions.step \nFROM group_consumptions \nWHERE group_consumptions.group_id = groups.group_id ORDER BY group_consumptions.position, group_consumptions.model\n LIMIT 1 OFFSET 0) AS consumed_at_step, (SELECT group_consumptions.scorer \nFROM group_consumptions \nWHERE group_consumptions.group_id = groups.group_id ORDER BY group_consumptions.position, group_consumptions.model\n LIMIT 1 OFFSET 0) AS consumed_with_scorer, (SELECT count(*) AS count_1 \nFROM group_consumptions \nWHERE group_consumptions.group_id = groups.group_id) AS num_consumptions, groups.sealed_at AS sealed_at, groups.position \nFROM groups LEFT OUTER JOIN (SELECT latest.group_id AS group_id, latest.scorer AS scorer, count(CASE WHEN (coalesce(latest.role, 'policy') != 'validation') THEN latest.reward END) AS num_rewards, avg(CASE WHEN (coalesce(latest.role, 'policy') != 'validation') THEN latest.reward END) AS reward_mean, min(CASE WHEN (coalesce(latest.role, 'policy') != 'validation') THEN latest.reward END) AS reward_min, max(CASE WHEN (coalesce(latest.role, 'policy') != 'validation') THEN latest.reward END) AS reward_max, avg(CASE WHEN (coalesce(latest.role, 'policy') = 'validation') THEN latest.reward END) AS validation_reward_mean \nFROM (SELECT latest_r.rollout_id AS rollout_id, latest_r.group_id AS group_id, latest_r.scorer AS scorer, latest_r.reward AS reward, latest_ro.role AS role \nFROM latest_rewards AS latest_r LEFT OUTER JOIN rollouts AS latest_ro ON latest_ro.rollout_id = latest_r.rollout_id) AS latest GROUP BY latest.group_id, latest.scorer) AS stats ON stats.group_id = groups.group_id LEFT OUTER JOIN (SELECT again.group_id AS group_id, again.scorer AS scorer, avg((again.reward - stats.reward_mean) * (again.reward - stats.reward_mean)) AS variance \nFROM (SELECT again_r.rollout_id AS rollout_id, again_r.group_id AS group_id, again_r.scorer AS scorer, again_r.reward AS reward, again_ro.role AS role \nFROM latest_rewards AS again_r LEFT OUTER JOIN rollouts AS again_ro ON again_ro.rollout_id = again_r.rollout_id) AS again JOIN (SELECT latest.group_id AS group_id, latest.scorer AS scorer, count(CASE WHEN (coalesce(latest.role, 'policy') != 'validation') THEN latest.reward END) AS num_rewards, avg(CASE WHEN (coalesce(latest.role, 'policy') != 'validation') THEN latest.reward END) AS reward_mean, min(CASE WHEN (coalesce(latest.role, 'policy') != 'validation') THEN latest.reward END) AS reward_min, max(CASE WHEN (coalesce(latest.role, 'policy') != 'validation') THEN latest.reward END) AS reward_max, avg(CASE WHEN (coalesce(latest.role, 'policy') = 'validation') THEN latest.reward END) AS validation_reward_mean \nFROM (SELECT latest_r.rollout_id AS rollout_id, latest_r.group_id AS group_id, latest_r.scorer AS scorer, latest_r.reward AS reward, latest_ro.role AS role \nFROM latest_rewards AS latest_r LEFT OUTER JOIN rollouts AS latest_ro ON latest_ro.rollout_id = latest_r.rollout_id) AS latest GROUP BY latest.group_id, latest.scorer) AS stats ON stats.group_id = again.group_id AND stats.scorer = again.scorer \nWHERE coalesce(again.role, 'policy') != 'validation' GROUP BY again.group_id, again.scorer) AS spread ON spread.group_id = stats.group_id AND spread.scorer = stats.scorer",
        "CREATE VIEW v_train_steps AS\nSELECT train_steps.id, train_steps.run, train_steps.model, train_steps.step_before, train_steps.step, train_steps.status, train_steps.scorer, train_steps.num_groups, train_steps.num_trajectories, train_steps.reward_mean, train_steps.checkpoint, train_steps.pushed_to, CASE WHEN train_steps.reconciled THEN 1 ELSE 0 END AS reconciled, train_steps.error_type, train_steps.error_message, train_steps.started_at AS started_at, train_steps.finished_at AS finished_at, train_steps.duration_s, NULLIF(train_steps.group_ids, 'null') AS group_ids, NULLIF(train_steps.metrics, 'null') AS metrics \nFROM train_steps",
        "CREATE VIEW v_train_step_metrics AS\nSELECT train_steps.id AS train_step_id, train_steps.run, train_steps.model, train_steps.step, train_steps.status, metric.\"key\" AS metric, (CASE WHEN metric.type IN ('integer', 'real') THEN CAST(metric.value AS DOUBLE PRECISION) WHEN metric.type = 'true' THEN 1.0 WHEN metric.type = 'false' THEN 0.0 END) AS value \nFROM train_steps JOIN json_each(CASE WHEN json_type(train_steps.metrics) = 'object' THEN train_steps.metrics ELSE '{}' END) AS metric ON 1 = 1",
        "CREATE VIEW v_trajectory_messages AS\nSELECT trajectory_messages.rollout_id, rollouts.run, rollouts.policy_step, rollouts.role AS rollout_role, trajectory_messages.history_index, trajectory_messages.message_index, trajectory_messages.role, trajectory_messages.content, CASE WHEN trajectory_messages.trainable THEN 1 ELSE 0 END AS trainable, trajectory_messages.num_logprobs, trajectory_messages.tool_call_id, (CASE WHEN json_type(trajectory_messages.tool_calls) = 'array' THEN json_array_length(trajectory_messages.tool_calls) ELSE 0 END) AS num_tool_calls, (SELECT group_concat(coalesce(json_extract(message_tool.value, '$.name'), json_extract(message_tool.value, '$.function.name')), ', ') AS text_agg_1 \nFROM json_each(CASE WHEN json_type(trajectory_messages.tool_calls) = 'array' THEN trajectory_messages.tool_calls ELSE '[]' END) AS message_tool) AS tool_names, NULLIF(trajectory_messages.tool_calls, 'null') AS tool_calls \nFROM trajectory_messages LEFT OUTER JOIN rollouts ON rollouts.rollout_id = trajectory_messages.rollout_id",
    ],
    "postgresql": [
        "CREATE VIEW v_runs AS\nSELECT runs.run, runs.project, runs.model, runs.base_model, runs.validation_model, runs.scorer, runs.status, runs.trainer, runs.error, runs.num_scenarios, coalesce(rollout_counts.num_rollouts, 0) AS num_rollouts, coalesce(rollout_counts.num_finished, 0) AS num_finished, coalesce(rollout_counts.num_failed, 0) AS num_failed, coalesce(rollout_counts.num_running, 0) AS num_running, coalesce(group_counts.num_groups, 0) AS num_groups, coalesce(step_counts.num_train_steps, 0) AS num_train_steps, step_counts.last_step, token_counts.total_tokens, to_char((runs.started_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') AS started_at, to_char((runs.finished_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') AS finished_at, CAST(EXTRACT(EPOCH FROM (runs.finished_at) - (runs.started_at)) AS DOUBLE PRECISION) AS duration_s, CASE WHEN json_typeof(runs.config) = 'null' THEN NULL ELSE runs.config END AS config \nFROM runs LEFT OUTER JOIN (SELECT rollouts.run AS run, count(*) AS num_rollouts, count(CASE WHEN (rollouts.status = 'finished') THEN 1 END) AS num_finished, count(CASE WHEN (rollouts.status = 'failed') THEN 1 END) AS num_failed, count(CASE WHEN (rollouts.status = 'running') THEN 1 END) AS num_running \nFROM rollouts GROUP BY rollouts.run) AS rollout_counts ON rollout_counts.run = runs.run LEFT OUTER JOIN (SELECT rollouts.run AS run, sum(llm_calls.total_tokens) AS total_tokens \nFROM llm_calls JOIN rollouts ON rollouts.rollout_id = llm_calls.rollout_id GROUP BY rollouts.run) AS token_counts ON token_counts.run = runs.run LEFT OUTER JOIN (SELECT groups.run AS run, count(*) AS num_groups \nFROM groups GROUP BY groups.run) AS group_counts ON group_counts.run = runs.run LEFT OUTER JOIN (SELECT train_steps.run AS run, count(*) AS num_train_steps, max(train_steps.step) AS last_step \nFROM train_steps \nWHERE train_steps.status = 'completed' GROUP BY train_steps.run) AS step_counts ON step_counts.run = runs.run",
        "CREATE VIEW v_rollouts AS\nSELECT rollouts.rollout_id, rollouts.run, rollouts.group_id, rollouts.scenario_index, rollouts.model, rollouts.role, rollouts.policy_step, rollouts.status, rollouts.error_type, rollouts.error_message, rollouts.num_llm_calls, rollouts.prompt_tokens, rollouts.completion_tokens, rollouts.total_tokens, rollouts.num_tool_calls, rollouts.llm_latency_s, runs.scorer, rollouts.reward, to_char((rollouts.started_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') AS started_at, to_char((rollouts.finished_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') AS finished_at, rollouts.duration_s, CASE WHEN rollouts.imported THEN 1 ELSE 0 END AS imported, CASE WHEN json_typeof(rollouts.scenario) = 'null' THEN NULL ELSE rollouts.scenario END AS scenario, CASE WHEN json_typeof(rollouts.result) = 'null' THEN NULL ELSE rollouts.result END AS result \nFROM rollouts LEFT OUTER JOIN runs ON runs.run = rollouts.run",
        "CREATE VIEW v_llm_calls AS\nSELECT llm_calls.call_id, llm_calls.rollout_id, rollouts.run, rollouts.group_id, rollouts.policy_step, rollouts.role, llm_calls.call_index, llm_calls.model, llm_calls.prompt_tokens, llm_calls.completion_tokens, llm_calls.total_tokens, llm_calls.latency_s, llm_calls.finish_reason, llm_calls.num_input_messages, (CASE WHEN json_typeof(llm_calls.tool_calls) = 'array' THEN json_array_length(llm_calls.tool_calls) ELSE 0 END) AS num_tool_calls, (SELECT string_agg(coalesce((call_tool.value #>> '{name}'), (call_tool.value #>> '{function,name}')), ', ' ORDER BY (call_tool.ordinality - 1)) AS text_agg_1 \nFROM json_array_elements(CASE WHEN json_typeof(llm_calls.tool_calls) = 'array' THEN llm_calls.tool_calls ELSE '[]'::json END) WITH ORDINALITY AS call_tool) AS tool_names, CASE WHEN llm_calls.has_logprobs THEN 1 ELSE 0 END AS has_logprobs, llm_calls.error_type, llm_calls.error_message, to_char((llm_calls.started_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') AS started_at, llm_calls.position, CASE WHEN json_typeof(llm_calls.tool_calls) = 'null' THEN NULL ELSE llm_calls.tool_calls END AS tool_calls, llm_calls.source, llm_calls.endpoint, CASE WHEN llm_calls.streamed THEN 1 ELSE 0 END AS streamed, CASE WHEN llm_calls.art_exchange THEN 1 ELSE 0 END AS art_exchange \nFROM llm_calls LEFT OUTER JOIN rollouts ON rollouts.rollout_id = llm_calls.rollout_id",
        "CREATE VIEW v_tool_calls AS\nSELECT calls.call_id, calls.rollout_id, rollouts.run, rollouts.policy_step, rollouts.role, calls.call_index, (tool.ordinality - 1) AS tool_index, coalesce((tool.value #>> '{name}'), (tool.value #>> '{function,name}')) AS tool_name, (CASE WHEN json_typeof(calls.tool_calls) = 'array' THEN json_array_length(calls.tool_calls) ELSE 0 END) AS num_parallel, calls.latency_s AS call_latency_s, CAST(EXTRACT(EPOCH FROM (calls.next_started_at) - (calls.started_at)) AS DOUBLE PRECISION) - calls.latency_s AS tool_time_s, to_char((calls.started_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') AS started_at, CASE WHEN json_typeof((tool.value -> 'args')) = 'null' THEN NULL ELSE (tool.value -> 'args') END AS args \nFROM (SELECT llm_calls.call_id AS call_id, llm_calls.rollout_id AS rollout_id, llm_calls.call_index AS call_index, llm_calls.latency_s AS latency_s, llm_calls.started_at AS started_at, llm_calls.tool_calls AS tool_calls, lead(llm_calls.started_at) OVER (PARTITION BY llm_calls.rollout_id ORDER BY llm_calls.call_index) AS next_started_at \nFROM llm_calls) AS calls JOIN json_array_elements(CASE WHEN json_typeof(calls.tool_calls) = 'array' THEN calls.tool_calls ELSE '[]'::json END) WITH ORDINALITY AS tool ON true LEFT OUTER JOIN rollouts ON rollouts.rollout_id = calls.rollout_id",
        "CREATE VIEW v_rewards AS\nSELECT rewards.rollout_id, rewards.group_id, rollouts.run, rollouts.policy_step, rollouts.role, rewards.scorer, rewards.reward, CASE WHEN rewards.rescored THEN 1 ELSE 0 END AS rescored, CASE WHEN (EXISTS (SELECT * \nFROM latest_rewards \nWHERE latest_rewards.rollout_id = rewards.rollout_id AND latest_rewards.scorer = rewards.scorer AND latest_rewards.position = rewards.position)) THEN 1 ELSE 0 END AS is_latest, to_char((rewards.recorded_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') AS recorded_at, rewards.position, rewards.id, CASE WHEN json_typeof(rewards.metrics) = 'null' THEN NULL ELSE rewards.metrics END AS metrics \nFROM rewards LEFT OUTER JOIN rollouts ON rollouts.rollout_id = rewards.rollout_id",
        "CREATE VIEW v_latest_rewards AS\nSELECT rewards.rollout_id, rewards.group_id, rollouts.run, rollouts.policy_step, rollouts.role, rewards.scorer, rewards.reward, CASE WHEN rewards.rescored THEN 1 ELSE 0 END AS rescored, (SELECT count(*) AS count_1 \nFROM rewards AS every \nWHERE every.rollout_id = rewards.rollout_id AND every.scorer = rewards.scorer) AS num_scores, to_char((rewards.recorded_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') AS recorded_at, rewards.position, rewards.id, CASE WHEN json_typeof(rewards.metrics) = 'null' THEN NULL ELSE rewards.metrics END AS metrics \nFROM rewards LEFT OUTER JOIN rollouts ON rollouts.rollout_id = rewards.rollout_id \nWHERE EXISTS (SELECT * \nFROM latest_rewards \nWHERE latest_rewards.rollout_id = rewards.rollout_id AND latest_rewards.scorer = rewards.scorer AND latest_rewards.position = rewards.position)",
        "CREATE VIEW v_groups AS\nSELECT groups.group_id, groups.run, groups.epoch, groups.batch, groups.scenario_index, groups.size, groups.num_validation, groups.num_failed, stats.scorer, coalesce(stats.num_rewards, 0) AS num_rewards, stats.reward_mean, CASE WHEN (stats.reward_max = stats.reward_min) THEN 0.0 ELSE sqrt(spread.variance) END AS reward_std, stats.reward_min, stats.reward_max, stats.validation_reward_mean, (SELECT group_consumptions.model \nFROM group_consumptions \nWHERE group_consumptions.group_id = groups.group_id ORDER BY group_consumptions.position, group_consumptions.model \n LIMIT 1) AS consumed_by, (SELECT group_consumptions.step \nFROM group_consumptions \nWHERE group_consumptions.group_id = groups.group_id ORDER BY group_consumptions.position, group_consumptions.model \n LIMIT 1) AS consumed_at_step, (SELECT group_consumptions.scorer \nFROM group_consumptions \nWHERE group_consumptions.group_id = groups.group_id ORDER BY group_consumptions.position, group_consumptions.model \n LIMIT 1) AS consumed_with_scorer, (SELECT count(*) AS count_1 \nFROM group_consumptions \nWHERE group_consumptions.group_id = groups.group_id) AS num_consumptions, to_char((groups.sealed_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') AS sealed_at, groups.position \nFROM groups LEFT OUTER JOIN (SELECT latest.group_id AS group_id, latest.scorer AS scorer, count(CASE WHEN (coalesce(latest.role, 'policy') != 'validation') THEN latest.reward END) AS num_rewards, avg(CASE WHEN (coalesce(latest.role, 'policy') != 'validation') THEN latest.reward END) AS reward_mean, min(CASE WHEN (coalesce(latest.role, 'policy') != 'validation') THEN latest.reward END) AS reward_min, max(CASE WHEN (coalesce(latest.role, 'policy') != 'validation') THEN latest.reward END) AS reward_max, avg(CASE WHEN (coalesce(latest.role, 'policy') = 'validation') THEN latest.reward END) AS validation_reward_mean \nFROM (SELECT latest_r.rollout_id AS rollout_id, latest_r.group_id AS group_id, latest_r.scorer AS scorer, latest_r.reward AS reward, latest_ro.role AS role \nFROM latest_rewards AS latest_r LEFT OUTER JOIN rollouts AS latest_ro ON latest_ro.rollout_id = latest_r.rollout_id) AS latest GROUP BY latest.group_id, latest.scorer) AS stats ON stats.group_id = groups.group_id LEFT OUTER JOIN (SELECT again.group_id AS group_id, again.scorer AS scorer, avg((again.reward - stats.reward_mean) * (again.reward - stats.reward_mean)) AS variance \nFROM (SELECT again_r.rollout_id AS rollout_id, again_r.group_id AS group_id, again_r.scorer AS scorer, again_r.reward AS reward, again_ro.role AS role \nFROM latest_rewards AS again_r LEFT OUTER JOIN rollouts AS again_ro ON again_ro.rollout_id = again_r.rollout_id) AS again JOIN (SELECT latest.group_id AS group_id, latest.scorer AS scorer, count(CASE WHEN (coalesce(latest.role, 'policy') != 'validation') THEN latest.reward END) AS num_rewards, avg(CASE WHEN (coalesce(latest.role, 'policy') != 'validation') THEN latest.reward END) AS reward_mean, min(CASE WHEN (coalesce(latest.role, 'policy') != 'validation') THEN latest.reward END) AS reward_min, max(CASE WHEN (coalesce(latest.role, 'policy') != 'validation') THEN latest.reward END) AS reward_max, avg(CASE WHEN (coalesce(latest.role, 'policy') = 'validation') THEN latest.reward END) AS validation_reward_mean \nFROM (SELECT latest_r.rollout_id AS rollout_id, latest_r.group_id AS group_id, latest_r.scorer AS scorer, latest_r.reward AS reward, latest_ro.role AS role \nFROM latest_rewards AS latest_r LEFT OUTER JOIN rollouts AS latest_ro ON latest_ro.rollout_id = latest_r.rollout_id) AS latest GROUP BY latest.group_id, latest.scorer) AS stats ON stats.group_id = again.group_id AND stats.scorer = again.scorer \nWHERE coalesce(again.role, 'policy') != 'validation' GROUP BY again.group_id, again.scorer) AS spread ON spread.group_id = stats.group_id AND spread.scorer = stats.scorer",
        "CREATE VIEW v_train_steps AS\nSELECT train_steps.id, train_steps.run, train_steps.model, train_steps.step_before, train_steps.step, train_steps.status, train_steps.scorer, train_steps.num_groups, train_steps.num_trajectories, train_steps.reward_mean, train_steps.checkpoint, train_steps.pushed_to, CASE WHEN train_steps.reconciled THEN 1 ELSE 0 END AS reconciled, train_steps.error_type, train_steps.error_message, to_char((train_steps.started_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') AS started_at, to_char((train_steps.finished_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') AS finished_at, train_steps.duration_s, CASE WHEN json_typeof(train_steps.group_ids) = 'null' THEN NULL ELSE train_steps.group_ids END AS group_ids, CASE WHEN json_typeof(train_steps.metrics) = 'null' THEN NULL ELSE train_steps.metrics END AS metrics \nFROM train_steps",
        "CREATE VIEW v_train_step_metrics AS\nSELECT train_steps.id AS train_step_id, train_steps.run, train_steps.model, train_steps.step, train_steps.status, metric.key AS metric, (CASE json_typeof(metric.value) WHEN 'number' THEN CAST(metric.value #>> '{}' AS DOUBLE PRECISION) WHEN 'boolean' THEN CASE WHEN CAST(metric.value AS TEXT) = 'true' THEN 1.0 ELSE 0.0 END END) AS value \nFROM train_steps JOIN json_each(CASE WHEN json_typeof(train_steps.metrics) = 'object' THEN train_steps.metrics ELSE '{}'::json END) AS metric ON true",
        "CREATE VIEW v_trajectory_messages AS\nSELECT trajectory_messages.rollout_id, rollouts.run, rollouts.policy_step, rollouts.role AS rollout_role, trajectory_messages.history_index, trajectory_messages.message_index, trajectory_messages.role, trajectory_messages.content, CASE WHEN trajectory_messages.trainable THEN 1 ELSE 0 END AS trainable, trajectory_messages.num_logprobs, trajectory_messages.tool_call_id, (CASE WHEN json_typeof(trajectory_messages.tool_calls) = 'array' THEN json_array_length(trajectory_messages.tool_calls) ELSE 0 END) AS num_tool_calls, (SELECT string_agg(coalesce((message_tool.value #>> '{name}'), (message_tool.value #>> '{function,name}')), ', ' ORDER BY (message_tool.ordinality - 1)) AS text_agg_1 \nFROM json_array_elements(CASE WHEN json_typeof(trajectory_messages.tool_calls) = 'array' THEN trajectory_messages.tool_calls ELSE '[]'::json END) WITH ORDINALITY AS message_tool) AS tool_names, CASE WHEN json_typeof(trajectory_messages.tool_calls) = 'null' THEN NULL ELSE trajectory_messages.tool_calls END AS tool_calls \nFROM trajectory_messages LEFT OUTER JOIN rollouts ON rollouts.rollout_id = trajectory_messages.rollout_id",
    ],
}


def _trained(dialect: str, aggregate: str) -> str:
    """`aggregate` over what a step trained, as v_train_steps joined it at revision 0006."""
    return (
        f"(SELECT {aggregate} FROM {STEP_GROUPS[dialect]} "
        f"JOIN rollouts AS r ON r.group_id = {GROUP_TEXT[dialect]} "
        "AND coalesce(r.role, 'policy') != 'validation' "
        "JOIN latest_rewards AS l ON l.rollout_id = r.rollout_id "
        "AND l.scorer = train_steps.scorer)"
    )


def upgrade() -> None:
    dialect = op.get_context().dialect.name
    for statement in _http_calls.DROP_VIEWS:
        op.execute(statement)
    op.add_column(
        "train_steps",
        sa.Column("num_trajectories", sa.Integer(), nullable=False, server_default="0"),
    )
    op.add_column("train_steps", sa.Column("reward_mean", sa.Float(), nullable=True))
    op.add_column("rollouts", sa.Column("reward", sa.Float(), nullable=True))
    op.execute(
        "UPDATE rollouts SET reward = (SELECT l.reward FROM latest_rewards AS l "
        "JOIN runs AS r ON r.scorer = l.scorer "
        "WHERE r.run = rollouts.run AND l.rollout_id = rollouts.rollout_id)"
    )
    op.create_table(
        "train_step_groups",
        sa.Column("group_id", sa.String(length=64), nullable=False),
        sa.Column(
            "train_step_id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("group_id", "train_step_id", name=op.f("pk_train_step_groups")),
    )
    op.create_index(
        "ix_rollouts_run_policy_step",
        "rollouts",
        [
            "run",
            "policy_step",
            "role",
            "reward",
            "num_llm_calls",
            "prompt_tokens",
            "completion_tokens",
            "total_tokens",
            "llm_latency_s",
        ],
        unique=False,
    )
    op.create_index(
        "ix_llm_calls_untimed",
        "llm_calls",
        ["rollout_id"],
        unique=False,
        sqlite_where=sa.text("latency_s IS NULL"),
        postgresql_where=sa.text("latency_s IS NULL"),
    )
    connection = op.get_bind()
    steps = connection.execute(sa.text("SELECT id, group_ids FROM train_steps")).all()
    rows = []
    for step_id, group_ids in steps:
        names = json.loads(group_ids) if isinstance(group_ids, str) else group_ids
        if isinstance(names, list):
            rows += [{"g": g, "s": step_id} for g in dict.fromkeys(names) if isinstance(g, str)]
    if rows:
        connection.execute(
            sa.text("INSERT INTO train_step_groups (group_id, train_step_id) VALUES (:g, :s)"),
            rows,
        )
    op.execute(
        f"UPDATE train_steps SET num_trajectories = {_trained(dialect, 'count(l.reward)')}, "
        f"reward_mean = {_trained(dialect, 'avg(l.reward)')}"
    )
    for statement in CREATE_VIEWS[dialect]:
        op.execute(statement)
    if dialect == "postgresql":
        _confined.grant_reader()  # a recreated view has lost its grants


def downgrade() -> None:
    dialect = op.get_context().dialect.name
    for statement in _http_calls.DROP_VIEWS:
        op.execute(statement)
    op.drop_index("ix_llm_calls_untimed", table_name="llm_calls")
    op.drop_index("ix_rollouts_run_policy_step", table_name="rollouts")
    op.drop_table("train_step_groups")
    with op.batch_alter_table("train_steps") as batch:
        batch.drop_column("reward_mean")
        batch.drop_column("num_trajectories")
    with op.batch_alter_table("rollouts") as batch:
        batch.drop_column("reward")
    for statement in _analysis.CREATE_VIEWS[dialect]:
        op.execute(statement)
    if dialect == "postgresql":
        _confined.grant_reader()
