-- Tokens per policy step: what the trained model's LLM calls consumed and produced.
SELECT
    COALESCE(run, '(no run)') AS run,
    policy_step,
    COUNT(*) AS num_llm_calls,
    COUNT(DISTINCT rollout_id) AS num_rollouts,
    SUM(prompt_tokens) AS prompt_tokens,
    SUM(completion_tokens) AS completion_tokens,
    SUM(total_tokens) AS total_tokens,
    CAST(SUM(total_tokens) AS DOUBLE PRECISION) / COUNT(DISTINCT rollout_id)
        AS tokens_per_rollout,
    AVG(latency_s) AS mean_latency_s
FROM v_llm_calls
WHERE role = 'policy' AND policy_step IS NOT NULL
GROUP BY COALESCE(run, '(no run)'), policy_step
ORDER BY run, policy_step;
