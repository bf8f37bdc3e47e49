-- Tokens per policy step: what the trained model's LLM calls consumed and produced.
--
-- Read from each rollout's call totals (v_rollouts), not from every call: the same
-- numbers as aggregating v_llm_calls, in a fraction of the time. A call that reported no
-- latency is left out of mean_latency_s, as AVG(latency_s) over the calls would.
WITH untimed AS (
    SELECT run, policy_step, COUNT(*) AS num_calls
    FROM v_llm_calls
    WHERE latency_s IS NULL AND role = 'policy' AND policy_step IS NOT NULL
    GROUP BY run, policy_step
)
SELECT
    COALESCE(ro.run, '(no run)') AS run,
    ro.policy_step,
    SUM(ro.num_llm_calls) AS num_llm_calls,
    COUNT(*) AS num_rollouts,
    SUM(ro.prompt_tokens) AS prompt_tokens,
    SUM(ro.completion_tokens) AS completion_tokens,
    SUM(ro.total_tokens) AS total_tokens,
    CAST(SUM(ro.total_tokens) AS DOUBLE PRECISION) / COUNT(*) AS tokens_per_rollout,
    SUM(ro.llm_latency_s)
        / NULLIF(SUM(ro.num_llm_calls) - COALESCE(MAX(u.num_calls), 0), 0) AS mean_latency_s
FROM v_rollouts AS ro
LEFT JOIN untimed AS u
    ON u.run IS NOT DISTINCT FROM ro.run AND u.policy_step = ro.policy_step
WHERE ro.role = 'policy' AND ro.policy_step IS NOT NULL AND ro.num_llm_calls > 0
GROUP BY COALESCE(ro.run, '(no run)'), ro.policy_step
ORDER BY run, ro.policy_step;
