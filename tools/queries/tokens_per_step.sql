-- Tokens per policy step: what the trained model's LLM calls consumed and produced.
--
-- Summed from each rollout's call totals (v_rollouts) rather than from every call
-- (v_llm_calls): the same numbers in a fraction of the time. A call that reported no
-- latency is left out of mean_latency_s, as AVG(latency_s) over the calls leaves it out.
WITH steps AS (
    SELECT
        run,
        policy_step,
        SUM(num_llm_calls) AS num_llm_calls,
        COUNT(*) AS num_rollouts,
        SUM(prompt_tokens) AS prompt_tokens,
        SUM(completion_tokens) AS completion_tokens,
        SUM(total_tokens) AS total_tokens,
        SUM(llm_latency_s) AS latency_s
    FROM v_rollouts
    WHERE role = 'policy' AND policy_step IS NOT NULL AND num_llm_calls > 0
    GROUP BY run, policy_step
),
-- COALESCE keeps the join of a call to its rollout an outer one, so that the database
-- starts from the few calls without a latency (an index holds just those) instead of
-- reading every call of every policy rollout.
untimed AS (
    SELECT run, policy_step, COUNT(*) AS num_llm_calls
    FROM v_llm_calls
    WHERE latency_s IS NULL AND COALESCE(role, '') = 'policy' AND policy_step IS NOT NULL
    GROUP BY run, policy_step
)
SELECT
    COALESCE(s.run, '(no run)') AS run,
    s.policy_step,
    s.num_llm_calls,
    s.num_rollouts,
    s.prompt_tokens,
    s.completion_tokens,
    s.total_tokens,
    CAST(s.total_tokens AS DOUBLE PRECISION) / s.num_rollouts AS tokens_per_rollout,
    s.latency_s / NULLIF(s.num_llm_calls - COALESCE(u.num_llm_calls, 0), 0) AS mean_latency_s
FROM steps AS s
LEFT JOIN untimed AS u
    ON COALESCE(u.run, '') = COALESCE(s.run, '') AND u.policy_step = s.policy_step
ORDER BY run, s.policy_step;
