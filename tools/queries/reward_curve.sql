-- Reward curve: the mean reward of the trained model's rollouts at each policy step.
--
-- A rollout's reward is the latest one recorded by its run's scorer (v_rollouts.reward;
-- a re-scoring replaces the older value here). Failed rollouts, validation rollouts and
-- rollouts without a reward are left out. Plot mean_reward against policy_step.
-- Grouped by the run itself (not its COALESCE), so that the database can read the
-- rollouts in the order of its index on (run, policy_step) instead of sorting them.
WITH steps AS (
    SELECT
        run,
        policy_step,
        COUNT(*) AS num_rollouts,
        AVG(reward) AS mean_reward,
        MIN(reward) AS min_reward,
        MAX(reward) AS max_reward
    FROM v_rollouts
    WHERE role = 'policy' AND reward IS NOT NULL AND policy_step IS NOT NULL
    GROUP BY run, policy_step
)
SELECT
    COALESCE(run, '(no run)') AS run,
    policy_step,
    num_rollouts,
    mean_reward,
    min_reward,
    max_reward
FROM steps
ORDER BY 1, policy_step;
