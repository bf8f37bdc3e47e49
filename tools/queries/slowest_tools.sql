-- Slowest tools, slowest first.
--
-- artstore records LLM calls, not tool runs: a tool's time is estimated as the gap between
-- the end of the LLM call that requested it and the start of the rollout's next LLM call
-- (v_tool_calls.tool_time_s). That gap is the tool's run plus the agent's own work in
-- between; when one call requests several tools at once (num_parallel > 1) they share
-- it, so mean_alone_s uses only the calls that requested a single tool. A call that
-- ended its rollout has no next call: its tools are counted but not timed.
-- mean_call_latency_s is the latency of the LLM calls that requested the tool.
SELECT
    tool_name,
    COUNT(*) AS num_calls,
    COUNT(tool_time_s) AS num_timed,
    AVG(tool_time_s) AS mean_time_s,
    MAX(tool_time_s) AS max_time_s,
    AVG(CASE WHEN num_parallel = 1 THEN tool_time_s END) AS mean_alone_s,
    AVG(call_latency_s) AS mean_call_latency_s
FROM v_tool_calls
GROUP BY tool_name
ORDER BY COALESCE(AVG(tool_time_s), -1) DESC, tool_name;
