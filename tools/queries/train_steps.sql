-- Train steps in order, with the mean (latest) reward of the trajectories each one
-- trained on, its loss when the backend reported one, and why it failed if it did.
SELECT
    s.run,
    s.model,
    s.step_before,
    s.step,
    s.status,
    s.scorer,
    s.num_groups,
    s.num_trajectories,
    s.reward_mean,
    loss.value AS loss,
    s.duration_s,
    s.pushed_to,
    s.error_message
FROM v_train_steps AS s
LEFT JOIN v_train_step_metrics AS loss
    ON loss.train_step_id = s.id AND loss.metric = 'loss'
ORDER BY s.run, s.model, s.id;
