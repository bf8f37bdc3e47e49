-- Failure rate per policy step: the share of the trained model's finished or failed
-- rollouts that failed (an exception in the agent). Rollouts still running are left out.
SELECT
    COALESCE(run, '(no run)') AS run,
    policy_step,
    COUNT(*) AS num_rollouts,
    SUM(CASE WHEN status = 'failed' THEN 1 ELSE 0 END) AS num_failed,
    CAST(SUM(CASE WHEN status = 'failed' THEN 1 ELSE 0 END) AS DOUBLE PRECISION)
        / COUNT(*) AS failure_rate
FROM v_rollouts
WHERE role = 'policy' AND status <> 'running' AND policy_step IS NOT NULL
GROUP BY COALESCE(run, '(no run)'), policy_step
ORDER BY run, policy_step;
