-- Reward curve: the mean reward of the trained model's rollouts at each policy step.
--
-- A rollout's reward is the latest one recorded by its run's scorer (v_rollouts.reward;
-- a re-scoring replaces the older value here). Failed rollouts, validation rollouts and
-- rollouts without a reward are left out. Plot mean_reward against policy_step.
SELECT
    COALESCE(run, '(no run)') AS run,
    policy_step,
    COUNT(*) AS num_rollouts,
    AVG(reward) AS mean_reward,
    MIN(reward) AS min_reward,
    MAX(reward) AS max_reward
FROM v_rollouts
WHERE role = 'policy' AND reward IS NOT NULL AND policy_step IS NOT NULL
GROUP BY COALESCE(run, '(no run)'), policy_step
ORDER BY run, policy_step;
