-- Groups without reward spread, per batch: a group whose rollouts all got the same
-- reward (reward_std = 0) gives GRPO no advantage to learn from. Rewards are each
-- group's latest by its run's scorer.
SELECT
    g.run,
    g.batch,
    COUNT(*) AS num_groups,
    SUM(CASE WHEN g.reward_std = 0 THEN 1 ELSE 0 END) AS num_without_spread,
    AVG(g.reward_std) AS mean_reward_std
FROM v_groups AS g
JOIN v_runs AS r ON r.run = g.run AND r.scorer = g.scorer
GROUP BY g.run, g.batch
ORDER BY g.run, g.batch;
