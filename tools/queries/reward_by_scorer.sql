-- Rewards by scorer: each scorer's latest rewards, for the trained model's rollouts
-- (role 'policy') and the validation model's apart.
--
-- num_rescored counts the rewards that come from a re-scoring (`artstore rescore`).
SELECT
    COALESCE(run, '(no run)') AS run,
    scorer,
    COALESCE(role, '(unknown)') AS role,
    COUNT(*) AS num_rewards,
    AVG(reward) AS mean_reward,
    MIN(reward) AS min_reward,
    MAX(reward) AS max_reward,
    SUM(rescored) AS num_rescored
FROM v_latest_rewards
GROUP BY COALESCE(run, '(no run)'), scorer, COALESCE(role, '(unknown)')
ORDER BY run, scorer, role;
