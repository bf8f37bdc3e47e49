"""Analysis queries through artstore's SQL views, against DuckDB and polars on ART's parquet.

The issue's question: how long do "reward per step" and "tokens per step" take through the
views, next to DuckDB or polars reading the same run from ART's own parquet files? One run
of this script generates the data, checks that every engine returns the same numbers, and
prints one table of timings with the ratios.

The data: one training run recorded through the real API (`artstore.open_store(url)` and
`store.append_nowait`, queued in bulk so that the store's group commit writes few large
transactions), by default 10,000 rollouts = 50 train steps x 25 groups x 8 rollouts:

- each rollout: `rollout.started` (policy step = the train step it is trained at),
  three `llm.call` events (tool call, tool call, answer; small messages stored as
  content-addressed blobs as the capture layer stores them, a few logprobs, token counts,
  latency) and `rollout.finished`, whose trajectory metrics carry the rollout's own token
  totals (`num_llm_calls`, `prompt_tokens`, `completion_tokens`, `llm_latency_s`), so that
  ART's parquet can answer the tokens question from what it stores;
- each group: `rewards.recorded` (scorer `correct`) and `group.sealed`;
- each train step: `train_step.started` and `train_step.completed` (step s -> s + 1).

The same event objects are appended to a SQLite file and to a fresh PostgreSQL database
(`bench_queries_*`, dropped at the end); PostgreSQL is then ANALYZEd (autovacuum would do
it soon after a real run); SQLite is left as artstore leaves it, without ANALYZE, unless
`--sqlite-analyze`. The run is exported from the first database by
`artstore.exchange.export_parquet` (what `artstore export RUN OUT --format parquet` runs),
which writes ART's layout with ART's own writer: `trajectories/train/<step:04d>.parquet`,
file N holding the groups of the train step that ended at step N (what `model.log`
writes), one row per trajectory, ART's columns. Generating and exporting take most of the
run (about 4 to 5 minutes on 2 busy CPUs for both databases); they are printed, not
compared.

The questions and what each engine computes:

1. `reward curve`: per policy step, the number of rewarded policy rollouts and their mean,
   min and max reward. artstore: `tools/queries/reward_curve.sql` over `v_rollouts`
   (a rollout's latest reward by the run's scorer). Parquet: count, avg, min, max of the
   `reward` column per file, policy step = file number - 1 (here every group is trained at
   the step its rollouts ran at, so the two numberings agree).
2. `train-step reward`: per completed train step, the number of trajectories it trained
   and their mean reward, from `v_train_steps` (`SELECT step, num_trajectories,
   reward_mean FROM v_train_steps WHERE status = 'completed' ORDER BY step`). Parquet:
   count and avg of `reward` per file, step = file number.
3. `tokens per step`: `tools/queries/tokens_per_step.sql`: per policy step, LLM calls,
   rollouts, prompt, completion and total tokens, tokens per rollout, mean call latency,
   summed from the rollouts' call totals in `v_rollouts` (the calls without a latency,
   from `v_llm_calls`, are left out of the mean, as AVG over the calls does;
   tests/cli/test_sql_cli.py checks that it equals the aggregate over `v_llm_calls`).
   Parquet: the same from each trajectory's `metrics` JSON text (sum of `num_llm_calls`,
   count of rows, sums of the token counts, total / rows, and
   sum of `llm_latency_s` / sum of `num_llm_calls`).

Every engine's rows must equal the first engine's (integers exactly, floats to a relative
1e-9), or the script fails. The engines, each timed on every question:

- `artstore sqlite` / `artstore postgresql`: `artstore.analysis.query(store, sql)`, the
  public path (`artstore sql` runs it): text check, a read-only connection from the
  store's pool of query connections, values made plain;
- `sqlite3` / `psycopg`: the same SQL text on one connection kept open, `fetchall()`: the
  database's own time for the views, without artstore around it;
- `duckdb parquet`: `read_parquet('<out>/trajectories/train/*.parquet', filename = true)`
  on one in-memory connection (files are read again by every query);
- `polars parquet`: `pl.scan_parquet(..., include_file_paths=...)`, lazy, `collect()`.

Timing: each engine runs each question once untimed-for-the-median ("first", the first
query of that engine in this process; the files are in the OS cache, having just been
written), then `--repeat` rounds (7 by default), engines interleaved and their order
rotated every round; the table shows the median of the rounds in milliseconds and the
ratio to `artstore sqlite` and to `duckdb parquet` (x 3.0 = three times as long).

Targets (issue 13), printed as PASS/MISS lines at the end: recording >= 5x the rate of
artstore with its projections written one statement per event, and importing the run's
JSONL export >= 5x as fast as that artstore imports it; each question through
`artstore.analysis.query` within 2x of DuckDB on the parquet; each database within 5x of
the parquet files' size. That recording peer is code no longer in the tree: the script
takes it from git history (`ONE_BY_ONE_COMMIT`, the last commit before projections were
written in bulk) and records the same run with it in a child process, after its own
recordings (`tools/record_baseline.py`; `--no-baseline` skips it, runs over 10,000
rollouts skip it unless `--baseline`). Without it, the rates measured for the issue
(`ONE_BY_ONE_EVENTS_PER_S`, another day) stand in, and the line says so.

Where the time went (profiled on 2,000 rollouts, 10,522 events, 2 busy CPUs):

- recording, one statement per event: the projection took 6.0 s of 6.9 s on SQLite and
  51 s of 54 s on PostgreSQL (under cProfile), ~27,000 statements for 10,522 events: an
  INSERT per rollout and call, an UPDATE of the rollout per call, a SELECT of the run per
  rollout, and per finished rollout two SELECTs (its calls' events, their blobs) before
  its messages. Now `artstore/projections/bulk.py` writes one executemany per table per
  batch and builds messages from the payloads at hand: the projection is ~2-3 s of it,
  of which the messages are two thirds (LangChain's message parsing, 0.4 s, and
  SQLAlchemy's per-row parameter processing: JSON columns, timestamps, TypeDecorators,
  ~35 us a row, ~0.9 s); the rest is the append itself (events and blobs INSERTs, JSON
  encoding of payloads), which this change leaves alone.
- analysis: v_rollouts aggregated all of `llm_calls` per rollout and found the latest
  reward with an anti-join over `rewards`, for every query; the reward curve took 89 ms
  in sqlite3. With the call totals kept on `rollouts` and `latest_rewards` (0006) it
  takes ~15 ms. Around the views, `artstore.analysis.query` then opened a fresh
  read-only connection per query (on PostgreSQL a new asyncpg connection, type
  introspection included: ~15 ms of a trivial query's 17 ms), checked the text
  (sqlglot, ~1 ms) and on SQLite called its Python progress handler every 1,000
  instructions (the timeout). Now query connections are kept (SQLite: a pool of
  read-only connections, authorizer and clock armed once, the handler every 20,000
  instructions with a deadline; PostgreSQL: a pool of its own, never lent to the store's
  work, its session reset after each query: advisory locks, settings, LISTEN): a
  trivial query costs ~1 ms on SQLite and ~2 ms on PostgreSQL. `tokens_per_step.sql`
  sums the rollouts' call totals per step instead of joining every call to its rollout
  and counting distinct rollouts (psycopg: 85 ms -> 17-34 ms; sqlite3: 60-95 ms ->
  50-68 ms, what is left being v_rollouts' per-row join to `latest_rewards`).

  Medians, ms, 10,000 rollouts, 2 CPUs shared with other sessions (load 6 to 9):

  | question | database | before | after | DuckDB before / after | ratio before / after |
  |---|---|---|---|---|---|
  | reward curve | SQLite | 20.5 | 34.3 | 18.0 / 31.7 | 1.14 / 1.08 |
  | train-step reward | SQLite | 30.2 | 32.1 | 11.4 / 29.8 | 2.64 / 1.08 |
  | tokens per step | SQLite | 75.9 | 54.4 | 19.9 / 57.3 | 3.82 / 0.95 |
  | reward curve | PostgreSQL | 39.8 | 34.3 | 18.0 / 31.7 | 2.21 / 1.08 |
  | train-step reward | PostgreSQL | 63.8 | 51.8 | 11.4 / 29.8 | 5.59 / 1.74 |
  | tokens per step | PostgreSQL | 113.5 | 42.6 | 19.9 / 57.3 | 5.71 / 0.74 |

  The two runs had different loads: DuckDB, multi-threaded, lost most to it (11-20 ms
  in the first run, 30-57 ms in the second), so the ratios of the second run flatter
  artstore. A third measurement on the same files, the engines alternating, gave
  SQLite 14.1 / 20.4 / 30.2 ms (x 1.16 / 1.54 / 1.74 of DuckDB) and PostgreSQL
  13.5 / 23.0 / 17.0 ms (x 1.43 / 2.47 / 0.91), the tokens query still the old one on
  SQLite. The train-step reward is the closest: v_train_steps joins every trained
  rollout to its group and reward (sqlite3 and psycopg alone take 25-36 ms, 16 ms of
  execution on PostgreSQL); a projection of each step's trained count and mean would
  take it off the table. All three scale linearly in the rollouts on every engine
  (each reads every rollout, or every parquet row, once); 100,000 rollouts were not
  measured (recording and export take ~10x as long).
- size (target: each database within 5x of ART's parquet; printed with where the bytes
  are, per table with its indexes, from SQLite's `dbstat` and PostgreSQL's
  `pg_table_size` / `pg_indexes_size`). Measured 2026-12-01, 2-core machine shared with
  other sessions (load average 4 to 5), Python 3.13 / ART 0.5.23 (parquet format 2),
  10,000 rollouts: SQLite 104.2 MiB, PostgreSQL 127.9 MiB, parquet 2.1 MiB (x 49.3 and
  x 60.4: MISS). Where the bytes are:

  | table (+ its indexes) | SQLite | PostgreSQL |
  |---|---|---|
  | events | 41.7 + 6.7 MiB (46%) | 41.4 + 10.7 MiB (41%) |
  | blobs | 23.8 + 3.8 MiB (27%) | 24.0 + 5.8 MiB (23%) |
  | trajectory_messages | 6.9 + 3.6 MiB (10%) | 9.6 + 6.0 MiB (12%) |
  | llm_calls | 6.0 + 2.9 MiB (9%) | 6.9 + 4.8 MiB (9%) |
  | rollouts | 2.8 + 1.3 MiB (4%) | 3.0 + 1.0 MiB (3%) |
  | rewards, latest_rewards, the rest | ~4 MiB | ~5 MiB |

  `events`: the 30,000 `llm.call` payloads are 27.2 MB of the 41.7 (~907 characters
  each: sorted keys spelled out in every row, nulls of fields a call does not use, and
  four to six blob hashes as 64 hex characters, ~330 characters); `rollout.started`
  3.6 MB, `rollout.finished` 2.3 MB. `blobs`: 48,810 bodies, 397 characters on average
  (LangChain's message dumps; the 28,783 answers carry two logprob entries each, too few
  for the logprob codec of bench_capture.py to shorten: none is stored compact here, so
  the codec leaves this run's size as it was, 104.2 -> 104.3 MiB). The primary key of
  `blobs` repeats each hash (3.8 MiB). The parquet holds each trajectory once as
  JSON (`trajectory_json`, logprobs included in format 2: ~2,300 characters a row,
  22 MB for the run), zstd-compressed about 10x. Reaching 5x (~10 MiB) would take the
  event log itself in another shape (binary hashes, payloads without the keys and nulls,
  or compressed bodies): the projections and their indexes alone are ~30 MiB. Not
  changed here.

Second pass (issue 13 items 2 and 3), 2026-12-01, 2-core machine shared with other
sessions (load average 1 at the start, 5 to 13 for the rest):

- recording, where the time goes now (cProfile, 2,000 rollouts, SQLite; profiled times):
  the caller's JSON encoding of the payloads (`append_nowait`, ~17%), the append itself
  (events and blobs INSERTs, ~25-30%: `insert_events` 0.7 s, `_insert_blobs` 0.2 s of
  4.3 s) and the projection (~50%), of which the trajectory messages are most: LangChain
  message parsing and row building in artstore/projections/trajectories.py (~0.7 s) and
  the INSERT of 15 message rows per rollout. SQLAlchemy's per-row parameter processing
  (`_init_compiled` + `construct_params`, ~1.0 s profiled) is gone: the bulk projection
  now compiles each INSERT once and runs one driver executemany with each value through
  its column's own bind processor (`execute_many` in bulk.py). Measured as this
  process's CPU time, interleaved with the code before it, 4,000 rollouts, three rounds:
  SQLite 6,118-7,094 -> 6,351-6,645 events per CPU second (no change beyond the noise:
  the saving pays for the new projections below), PostgreSQL (client side only)
  6,840-7,403 -> 7,650-8,222. The wall-clock rate follows the machine's load more than
  the code: the same code recorded 10,000 rollouts at 5,417 ev/s on SQLite (5.55x) and
  5,207 ev/s on PostgreSQL (9.0x) at load 1, 3,090 and 2,558 ev/s at load 7, 1,204 and
  1,021 ev/s at load 11 (5,823 and 6,638 events per CPU second). What is left is the
  append (eventstore, not changed here) and the message rows (trajectories.py).
- analysis, three changes (revision 0009):
  - train-step reward: v_train_steps joined every trained rollout to its group and
    latest reward at each query (PostgreSQL: two hash joins over all rollouts and latest
    rewards, 17 ms of execution at 10,000 rollouts under EXPLAIN ANALYZE; no index
    missing, the shape was the cost). What a step trained is now kept on its row
    (`train_steps.num_trajectories`, `reward_mean`, artstore/projections/trained.py),
    summed again with the same join when the step, a latest reward (a re-scoring after
    training included) or a member of its groups changes; `train_step_groups` finds the
    steps of a group. The query reads one row per step: 0.1 ms in sqlite3, 0.5 ms in
    psycopg.
  - reward curve and tokens per step: v_rollouts looked up each rollout's latest reward
    in `latest_rewards`; at 100,000 rollouts that lookup, a sort for GROUP BY
    COALESCE(run, ...) and the rollouts' wide rows made SQLite 10x DuckDB. The reward by
    the run's scorer is now kept on the rollout's row (`rollouts.reward`,
    artstore/projections/rollout_rewards.py), an index on (run, policy_step, role,
    reward, the call totals) covers both questions, and reward_curve.sql groups by the
    run itself so that SQLite reads that index in order without sorting.
  - tokens per step counted the calls without a latency by joining every policy call
    to its rollout; a partial index holds just those calls, and `COALESCE(role, '')`
    keeps the join an outer one so that both planners start from that index.
  `artstore.analysis.query` also keeps the last 256 checked texts (sqlglot took 0.1-2 ms
  a query; the "first" column still pays it).

  Medians, ms, and the ratio to DuckDB, at load 9 to 11 (the 10,000 run, all six engines
  side by side; before = the first run of this pass, at load 1):

  | question | database | before 10k | after 10k | after 100k |
  |---|---|---|---|---|
  | reward curve | SQLite | 11.5 (x 1.45) | 5.7 (x 0.29) | 22.5 (x 0.32) |
  | train-step reward | SQLite | 12.7 (x 2.21) | 1.9 (x 0.22) | 2.7 (x 0.05) |
  | tokens per step | SQLite | 22.3 (x 2.43) | 5.8 (x 0.40) | 29.0 (x 0.20) |
  | reward curve | PostgreSQL | 10.5 (x 1.33) | 29.7 (x 1.48) | 78.2 (x 1.11) |
  | train-step reward | PostgreSQL | 11.4 (x 1.99) | 2.7 (x 0.31) | 5.8 (x 0.11) |
  | tokens per step | PostgreSQL | 13.3 (x 1.45) | 12.2 (x 0.84) | 71.3 (x 0.49) |

  The 100,000 run (`--databases sqlite,postgresql --rollouts 100000`, once, ~26 min)
  measured its queries at load 3.5 to 5; DuckDB took 70.7 / 51.8 / 144.6 ms there (20.1
  / 8.7 / 14.6 at 10,000). Before the rollout's reward was kept on its row, a first
  100,000 run (SQLite only, load 11 to 13) gave 975 ms (x 10.5) for the reward curve and
  578 ms (x 5.5) for tokens per step: the lookup per rollout and the sort grew faster
  than the rollouts (sqlite3 CPU time 9 ms at 10,000, 173 ms at 100,000). How each scales
  now: the reward curve and tokens per step read every policy rollout once (SQLite: the
  covering index, in order, no sort; PostgreSQL: a sequential scan and a hash aggregate),
  linear in the rollouts; the train-step reward reads one row per step, linear in the
  steps (50 -> 500 rows: 1.9 -> 2.7 ms on SQLite), so it does not grow with the group
  size. DuckDB grows with the number of files (one per step). Recording at 100,000:
  1,126 ev/s on SQLite and 736 ev/s on PostgreSQL at load 11 (MISS, as at 10,000 under
  that load); the first 100,000 run recorded 1,645 ev/s on SQLite.
  Recording stays a MISS on this machine whenever other sessions load it; it passes
  (5.55x, 9.0x) only when the machine is idle, and the code changed here does not move
  its CPU cost much: the rest is the append and the message rows (see above).

Recording on PostgreSQL at 100,000 rollouts (2026-12-01): 3,992 ev/s at 10,000 but 1,770
at 100,000 (SQLite 6,663 and 5,267), the client 78 s CPU of 297 s. Each statement timed
per tenth of the run (client-side, SQLAlchemy cursor events): two grew with the log, the
rest only with the machine's load. Both asked `events` for hundreds of streams at once
with `stream_id IN (...)`: the stream heads of a batch's new streams (store.py) and the
`trajectory.recorded` events of the rollouts it finished (bulk.py; `StoredCalls.load`
and `read_streams` have the same shape). The database was never ANALYZEd during the run
(autovacuum is off on this server; on another it comes a while after a bulk load), and
without statistics PostgreSQL takes each id of an IN list on a non-unique column to match
0.5% of the rows: the list of 500 matched "all of them", and every batch scanned the
whole log (parallel seq scan, 150 ms per 500 ids at 526,000 events, 50,000 pages read
from outside shared_buffers): 53 s + 12 s of 285 s, the last tenth 14x the first. Now
each stream is looked up on its own (artstore/eventstore/streams.py: `unnest` of an
array, a LATERAL lookup or max() per id, on the (stream, version) index whatever the
statistics: 0.15 s -> 5-10 ms per 500 ids), and the writer's session runs without JIT
(the estimate of 500 lookups before ANALYZE passed jit_above_cost: 40-140 ms of
compiling per statement). Lookups by a primary key (`refresh_rewards`,
`steps_of_rollouts`, blobs) were not the cause: the planner knows the key is unique,
seq-scans `rollouts` while 500 keys cost more through the index and turns to the index
as the table grows; their time per tenth did not grow. Measured side by side (the code
before and after, two processes at once, load average 4 to 11, Python 3.13): recording only
(100,000 rollouts) 1,125 -> 1,300 ev/s, the two lookups 84.6 s -> 6.1 s; the full bench
(`--databases postgresql --rollouts 100000`, load 9 to 11) 771 -> 865 ev/s; 10,000
rollouts (load 11) 977 -> 1,055 ev/s (the lookups 2.1 -> 0.7 s). What grows still, per
statement, grew as much as a one-row lookup of `runs` did, i.e. with the load (INSERTs
into random-keyed indexes, larger than shared_buffers at 100,000, may add some).
After merging, with the machine otherwise idle (load 1.0 throughout, Python 3.13), the
100,000-rollout recording on PostgreSQL took 342 s = 1,537 ev/s (the client 95 s of CPU):
no faster than the 1,770 measured before the change on another idle run. Load 1.0 with
the client at 28% says one server backend is busy most of the time; what it spends that
time on at this size (the database is ~1.3 GiB against 128 MiB of shared_buffers, never
analyzed) is not traced yet.

Third pass on recording (2026-12-01 and 02, 2-core machine, otherwise idle; py-spy of
the whole recording, 10,000 rollouts, SQLite). Found: ~15% of the time built the
compact form of blobs (artstore/eventstore/blob_codec.py) and threw it away: this run's
answers carry two logprob entries each, too few for the compact form to be shorter, and
each was parsed, taken apart and written out again before being kept as it was. And the
cyclic collector: the same recording with `gc.disable()` ran at ~6,650-6,830 events/s
instead of ~4,300-4,800. The bench queues all 11,302 appends before awaiting them, so
~half a million containers (rows, payload documents, futures) are alive at once, and
every full collection, each time the heap has grown by a quarter, traverses all of them;
most of those collections are triggered by the caller's own encoding in `append_nowait`.
Changed: a text with fewer than five `"logprob"` entries is not tried in the compact
form (`_MIN_LOGPROBS`), and the writer builds and writes each batch with the collector
paused (`artstore.collector`: rows, recorded events and projection rows live until the
batch commits; the collections they are due run once it resumes, and the older
generations are visited less often), 5-10% less CPU. The collections the caller's
queueing triggers are left alone: pausing the collector around user code is not a
store's to do. The recording peer is now run side by side (above): on 2026-12-02,
Python 3.11, idle, SQLite 3,592 vs 704 events/s (5.10x, PASS) and PostgreSQL 2,319 vs
461 (5.03x, PASS); an earlier run the same morning recorded 4,162 and 2,396 events/s,
and the peer, run alone right after it, 777 and 428 (5.36x, 5.60x). On 2026-12-01's
machine (a faster one) the same code recorded 5,655 and 3,514 events/s (5.79x and 6.09x
of the rates measured for the issue). What is left per event is the append (JSON of the
payloads, the events and blobs INSERTs) and the message rows of the projection.

Fourth pass on recording (2026-12-02, a faster 2-core machine, otherwise idle; py-spy of
the writer thread, 10,000 rollouts, SQLite). The side-by-side peer is faster here too
(1,500-1,770 events/s on SQLite), and artstore was at 4.56-5.11x. Found, of the writer's
time: 76% projection, of which ~23% the message rows: LangChain message objects built
from the stored documents (~10%), their rows (~5%), reading back from the blobs table the
blobs the batch itself had just stored (~4%). Changed: the projector gets the blob texts
the transaction's appends carried, and uses one wherever its SHA-256 is its hash
(`read_stored_blobs(..., at_hand)`), and message rows are read from the documents
themselves where LangChain would read the document back unchanged in the row's fields
(`StoredMessage.plain`: a human, system, ai or tool message with text content and no
field its class lacks; a message is built when the merging rule must compare two by
value). tests/projections/test_message_rows.py holds the rows to those LangChain's objects give.
The writer's time went from 967 to 765 samples (-21%). The caller's side is now about a
third of the wall time, nearly all of it the cyclic collector's passes over the bench's
own queued plan during `canonical_json` (see the third pass). Same run, alternating
trees, SQLite, Python 3.11: before 8,127 / 8,101 events/s (4.61x / 4.65x), after 9,121 /
8,329 (5.14x / 4.82x). Full runs after: Python 3.11 SQLite 8,554 vs 1,725 (4.96x, MISS),
PostgreSQL 5,772 vs 782 (7.38x); Python 3.13 SQLite 9,130 vs 1,623 (5.62x), PostgreSQL
5,952 vs 758 (7.85x). Then checks that cost ~3-5%: a plain document's fields are
validated by their types (strict mode), and every blob an append carries is hashed and
refused unless its SHA-256 is its key (the projection then trusts the batch's texts).
With them, same day: Python 3.11 SQLite 7,773 / 7,420 vs 1,548 / 1,490 (5.02x / 4.98x,
two runs), PostgreSQL 5,158 vs 691 (7.47x); Python 3.13 SQLite 8,233 vs 1,505 (5.47x),
PostgreSQL 5,490 vs 680 (8.07x). Tried and left out: keeping only the JSON text of queued payloads
(parsing it again in the writer) saves ~3%, but the projection then sees payload keys in
canonical order, not the order the caller gave (a reward table's row order follows a
`rewards` dict's order); that is what a rebuild sees, and should be decided on its own.

Fifth pass (2026-12-02, evening, a 2-core machine, otherwise idle, Python 3.11, SQLite;
`gc.callbacks` timing every collection during the recording alone): the three full
collections of the recording took 1.52 s of 7.3 s, all in the caller's thread. Queueing
the run's 11,302 appends added 150,540 objects the collector tracks to the plan's 431,000:
each payload's dumped document (a tree of dicts and lists kept for the projector) and
each payload's text, a `str` subclass with a `__dict__` (`EncodedJson`), which the
collector tracks as a container. Changed (decided: projections are what the log says):
a queued append holds its payloads as plain JSON text, and the writer reads each document
back from it (`load_payload`: pydantic's parser, exact for integers of any size) for the
projector (in a batch, with the collector paused); the projector now sees keys in the
stored order, as a rebuild does (SQLite's text and PostgreSQL's `json` keep the sorted
text), so a live projection and a rebuild agree (a test that ordered reward rows by their
surrogate id now reads them by rollout). A review found that PostgreSQL's plain INSERT
(a batch that cannot go side by side, the checked way) then sent the text through the
JSON column's serializer, which encoded it again as a JSON string: it now binds the text
and casts it, and a test appends every way and asks the database for each payload's
type. Queueing adds 45,336 objects, and one full collection is left (~0.5 s). Trees
alternated in one session, 4 rounds: before 5,311 / 5,230 / 5,894 / 4,921 events/s,
after 5,826 / 6,282 / 6,138 / 5,589 (+4% to +20%, +12% on the median).

Importing (2026-12-03; issue 13 asks `artstore import` of the run to be correspondingly
faster). The bench exports the recorded run as JSONL (`export_jsonl`, what `artstore
export RUN OUT --format jsonl` writes) and times `import_path` of it (what `artstore
import` runs) into a fresh database of each kind; the child of `record_baseline.py`
imports the same file with the one-statement-per-event commit, in the same run. The
target line holds the import to recording's 5x. Found (cProfile, py-spy; SQLite, 10,000
rollouts): the import spent 37 s of CPU against the old commit's 44. Each rollout's
`trajectory.imported` was projected by a handler of its own, which flushed the batch's
bulk projection first: a pass of the reward and train-step refreshes, the recorded-
trajectory query and the blob reads per rollout. Each group was its own transaction
(1,250). Reading the JSONL and building the events ran the collector over the whole plan
again and again (40% of that part). Changed: `trajectory.imported` is projected in bulk
(its blobs read once per batch, mostly from the texts the appends carried); groups are
queued a window of ~5,000 events at a time (`append_together_nowait` keeps each group in
one transaction), 14 transactions in all; reading and building run with the collector
paused. Measured in one run: SQLite 13.6 s against 41.6 s (3.06x, MISS), PostgreSQL 12.1
s against 225.5 s (18.6x, PASS); alone on the machine, SQLite's import took 9.5-12.5 s
(noise of +-15%). What is left on SQLite (py-spy, 200 samples/s): reading and validating
the JSONL (each Choice through pydantic) ~2-3 s and building the events and blobs ~2 s
on the event loop's thread, then encoding and queueing the appends (the secret scan, each
blob's hash checked) ~1.5 s there while the writer thread writes the events, blobs and
projection rows (~6-8 s, its Python holding the GIL the loop's thread needs). The old
commit spent about as long reading and building: that part, which a file import cannot
skip, bounds the ratio on SQLite. Tried and left out: queueing the next window while the
writer writes the current one, and pausing the collector while a window is queued (no
gain beyond the noise).

Run it from the repository root:

    python tools/bench_queries.py                  # 10,000 rollouts, SQLite and PostgreSQL
    python tools/bench_queries.py --quick          # 1,000 rollouts, 3 rounds: a smoke run
    python tools/bench_queries.py --databases sqlite --rollouts 20000 --repeat 11
    python tools/bench_queries.py --sqlite-analyze # with SQLite's planner statistics
    python tools/bench_queries.py --keep           # keep the databases and files, print where

PostgreSQL comes from `--postgres-url`, else `$ARTSTORE_BENCH_POSTGRES_URL`, else
`postgresql://postgres@127.0.0.1:5432/test`; the user must be allowed to create databases.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import secrets
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before `art` is imported

import duckdb
import polars as pl
import psycopg
import record_baseline  # tools/record_baseline.py, beside this file
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from rich.console import Console
from rich.table import Table
from sqlalchemy.engine import make_url

import artstore
from artstore.analysis import query
from artstore.art_versions import parquet_format_version
from artstore.documents import messages as lc
from artstore.events import (
    Event,
    GroupSealed,
    LLMCall,
    RewardsRecorded,
    RolloutFinished,
    RolloutStarted,
    RunFinished,
    RunStarted,
    TrainStepCompleted,
    TrainStepStarted,
)
from artstore.eventstore import blob_hash
from artstore.eventstore.blobs import canonical_json
from artstore.exchange import export_jsonl, export_parquet, import_path
from artstore.groups import group_id_for

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
DATABASES = ("sqlite", "postgresql")
QUERIES = Path(__file__).parent / "queries"

PROJECT = "bench"
RUN = "bench/agent-001"
MODEL = "bench/agent-001"
SCORER = "correct"
GROUPS_PER_STEP = 25
GROUP_SIZE = 8
CALLS_PER_ROLLOUT = 3
ROLLOUTS_PER_STEP = GROUPS_PER_STEP * GROUP_SIZE
BASE = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
REL_TOL = 1e-9

# The recording target's peer: artstore before projections were written in bulk (each
# event projected by statements of its own), the last commit with that code. It is run
# side by side from git history (tools/record_baseline.py) at the same size.
ONE_BY_ONE_COMMIT = "03e12f541851f9bf20cc4031d30591df1d2e046c"
# Its rates at 10,000 rollouts as measured for issue 13 (another day, the same kind of
# machine): the reference where the history is not at hand or the peer is not run.
ONE_BY_ONE_EVENTS_PER_S = {"sqlite": 976, "postgresql": 577}
RECORDING_TARGET = 5.0  # x the peer's rate
BASELINE_MAX_ROLLOUTS = 10_000  # larger runs skip the peer unless --baseline asks for it
ANALYSIS_TARGET = 2.0  # artstore's median / DuckDB's on ART's parquet, at most
SIZE_TARGET = 5.0  # the database / ART's parquet files, at most

SYSTEM = SystemMessage("You answer arithmetic questions. Use the tools.")
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"the {name} tool",
            "parameters": {"type": "object", "properties": {arg: {"type": "string"}}},
        },
    }
    for name, arg in (("search", "q"), ("calculator", "expr"))
]
SCENARIOS = [
    {"question": f"What is {a} + {a * 7 % 13}?", "answer": str(a + a * 7 % 13)}
    for a in range(GROUPS_PER_STEP)
]


# --- the generated run --------------------------------------------------------------------


@dataclass
class Append:
    stream: str
    events: list[Event]
    blobs: dict[str, str] = field(default_factory=dict)


@dataclass
class Plan:
    """The appends of one generated run, in order, and its size."""

    steps: int
    appends: list[Append]

    @property
    def rollouts(self) -> int:
        return self.steps * ROLLOUTS_PER_STEP

    @property
    def events(self) -> int:
        return sum(len(a.events) for a in self.appends)


def _blob(body: str, blobs: dict[str, str]) -> str:
    digest = blob_hash(body)
    blobs[digest] = body
    return digest


def _ai_message(
    rng: random.Random, turn: int, scenario: dict[str, str], prompt: int, completion: int
) -> AIMessage:
    """Turn 0 asks the calculator, turn 1 searches, the last turn answers."""
    last = turn == CALLS_PER_ROLLOUT - 1
    tool_calls = (
        []
        if last
        else [
            {
                "name": "calculator" if turn == 0 else "search",
                "args": {"expr": scenario["question"][8:-1]} if turn == 0 else {"q": "sum"},
                "id": f"call_{uuid.UUID(int=rng.getrandbits(128)).hex[:12]}",
                "type": "tool_call",
            }
        ]
    )
    content = scenario["answer"] if last and rng.random() < 0.7 else ("" if not last else "7")
    tokens = [*(content or "call").split(), "<eos>"]
    return AIMessage(
        content=content,
        tool_calls=tool_calls,
        response_metadata={
            "finish_reason": "stop" if last else "tool_calls",
            "model_name": MODEL,
            "logprobs": {
                "content": [
                    {
                        "token": tok,
                        "logprob": -0.125,
                        "bytes": list(tok.encode()),
                        "top_logprobs": [],
                    }
                    for tok in tokens
                ]
            },
        },
        usage_metadata={
            "input_tokens": prompt,
            "output_tokens": completion,
            "total_tokens": prompt + completion,
        },
    )


def _rollout_append(
    rng: random.Random, step: int, group: int, index: int, group_id: str, tools: str
) -> Append:
    """The events the capture layer writes for one rollout (here in one append)."""
    rollout_id = str(uuid.UUID(int=rng.getrandbits(128)))
    scenario = SCENARIOS[group]
    started = BASE + timedelta(seconds=step * 600 + group * 10 + index * 0.125)
    blobs: dict[str, str] = {}
    events: list[Event] = [
        RolloutStarted(
            rollout_id=rollout_id,
            run=RUN,
            group_id=group_id,
            scenario=scenario,
            scenario_index=group,
            model=MODEL,
            policy_step=step,
            started_at=started,
        )
    ]
    history: list[BaseMessage] = [SYSTEM, HumanMessage(scenario["question"])]
    at = 0.0
    totals = {"prompt": 0, "completion": 0, "latency": 0.0}
    for turn in range(CALLS_PER_ROLLOUT):
        prompt = 120 + 45 * turn + rng.randrange(40)
        completion = rng.randrange(5, 90)
        latency = round(rng.uniform(0.2, 2.5), 6)
        output = _ai_message(rng, turn, scenario, prompt, completion)
        events.append(
            LLMCall(
                call_id=str(uuid.UUID(int=rng.getrandbits(128))),
                index=turn,
                input=[_blob(lc.dump_message(m), blobs) for m in history],
                output=_blob(lc.dump_message(output), blobs),
                tools=tools,
                model=MODEL,
                prompt_tokens=prompt,
                completion_tokens=completion,
                latency_s=latency,
                finish_reason=output.response_metadata["finish_reason"],
                tool_calls=lc.tool_calls_of(output),
                num_logprobs=lc.count_logprobs(output),
                started_at=started + timedelta(seconds=at),
            )
        )
        at += latency + 0.25
        totals["prompt"] += prompt
        totals["completion"] += completion
        totals["latency"] += latency
        history.append(output)
        history.extend(
            ToolMessage(f"result of {call['name']}: 42", tool_call_id=call["id"])
            for call in output.tool_calls
        )
    events.append(
        RolloutFinished(
            rollout_id=rollout_id,
            result={"answer": history[-1].content},
            duration_s=at,
            metrics={
                "num_llm_calls": CALLS_PER_ROLLOUT,
                "prompt_tokens": totals["prompt"],
                "completion_tokens": totals["completion"],
                "llm_latency_s": totals["latency"],
            },
        )
    )
    return Append(f"rollout-{rollout_id}", events, blobs)


def plan_run(steps: int, seed: int) -> Plan:
    """Every append of the run: steps x 25 groups x 8 policy rollouts, rewarded and trained."""
    rng = random.Random(seed)
    tools_blobs: dict[str, str] = {}
    tools = _blob(canonical_json(TOOLS), tools_blobs)
    appends = [
        Append(
            f"run-{RUN}",
            [
                RunStarted(
                    run=RUN,
                    project=PROJECT,
                    model=MODEL,
                    base_model="Qwen/Qwen2.5-0.5B-Instruct",
                    config={"groups_per_step": GROUPS_PER_STEP, "group_size": GROUP_SIZE},
                    scenarios=SCENARIOS,
                    scorer=SCORER,
                    trainer="bench-host:1",
                )
            ],
        )
    ]
    for step in range(steps):
        group_ids = []
        for group in range(GROUPS_PER_STEP):
            group_id = group_id_for(RUN, step, group)
            group_ids.append(group_id)
            rollouts = [
                _rollout_append(rng, step, group, index, group_id, tools)
                for index in range(GROUP_SIZE)
            ]
            if step == 0 and group == 0:
                rollouts[0].blobs.update(tools_blobs)
            appends.extend(rollouts)
            ids = [a.stream.removeprefix("rollout-") for a in rollouts]
            # Rewards improve with the steps, spread within a group, clipped to [0, 1].
            centre = 0.2 + 0.6 * step / max(steps - 1, 1)
            rewards = {rid: min(1.0, max(0.0, rng.gauss(centre, 0.25))) for rid in ids}
            appends.append(
                Append(
                    f"group-{group_id}",
                    [
                        RewardsRecorded(group_id=group_id, scorer=SCORER, rewards=rewards),
                        GroupSealed(
                            group_id=group_id,
                            run=RUN,
                            epoch=step,
                            batch=step,
                            scenario_index=group,
                            rollout_ids=ids,
                        ),
                    ],
                )
            )
        train = dict(run=RUN, model=MODEL, group_ids=group_ids, scorer=SCORER)
        appends.append(
            Append(
                f"train-{RUN}",
                [
                    TrainStepStarted(step=step, trainer="bench-host:1", **train),
                    TrainStepCompleted(
                        step=step + 1,
                        metrics={"loss": rng.uniform(0.1, 1.0)},
                        duration_s=rng.uniform(20, 40),
                        **train,
                    ),
                ],
            )
        )
    appends.append(Append(f"run-{RUN}", [RunFinished(run=RUN)]))
    return Plan(steps, appends)


async def record(store: artstore.Store, plan: Plan) -> None:
    """Queue every append (the store commits them in few large transactions), then wait."""
    futures = [store.append_nowait(a.stream, a.events, blobs=a.blobs) for a in plan.appends]
    await asyncio.gather(*futures)


# --- where the data live -----------------------------------------------------------------


@dataclass
class Place:
    """A temporary folder (SQLite file, parquet files) and fresh PostgreSQL databases."""

    postgres_url: str
    folder: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="bench_queries_")))
    created: list[str] = field(default_factory=list)

    @property
    def sqlite_file(self) -> Path:
        return self.folder / "artstore.db"

    @property
    def parquet_dir(self) -> Path:
        return self.folder / "parquet"

    def admin_conninfo(self) -> str:
        url = make_url(self.postgres_url).set(drivername="postgresql")
        return url.render_as_string(hide_password=False)

    def postgres_database(self) -> str:
        """A fresh database; its libpq URL."""
        name = f"bench_queries_{secrets.token_hex(4)}"
        with psycopg.connect(self.admin_conninfo(), autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        self.created.append(name)
        url = make_url(self.postgres_url).set(drivername="postgresql", database=name)
        return url.render_as_string(hide_password=False)

    def clean(self) -> None:
        if self.created:
            with psycopg.connect(self.admin_conninfo(), autocommit=True) as connection:
                for name in self.created:
                    connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        shutil.rmtree(self.folder, ignore_errors=True)


def sqlite_bytes(path: Path) -> int:
    """The file's size after a checkpoint (WAL folded in), WAL included if any remains."""
    with sqlite3.connect(path) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    wal = path.with_name(path.name + "-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def postgres_bytes(conninfo: str) -> int:
    with psycopg.connect(conninfo) as connection:
        row = connection.execute("SELECT pg_database_size(current_database())").fetchone()
    assert row is not None
    return int(row[0])


def sqlite_bytes_by_table(path: Path) -> dict[str, tuple[int, int]]:
    """(table pages, index pages) in bytes per table, from SQLite's `dbstat`."""
    with sqlite3.connect(path) as connection:
        owner = dict(connection.execute("SELECT name, tbl_name FROM sqlite_schema"))
        pages = connection.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name").fetchall()
    found: dict[str, tuple[int, int]] = {}
    for name, used in pages:
        table = owner.get(name, name)
        heap, indexes = found.get(table, (0, 0))
        found[table] = (heap + used, indexes) if table == name else (heap, indexes + used)
    return found


def postgres_bytes_by_table(conninfo: str) -> dict[str, tuple[int, int]]:
    """(table with its TOAST, indexes) in bytes per table of the public schema."""
    with psycopg.connect(conninfo) as connection:
        rows = connection.execute(
            "SELECT c.relname, pg_table_size(c.oid), pg_indexes_size(c.oid) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind = 'r' AND n.nspname = 'public'"
        ).fetchall()
    return {name: (int(heap), int(indexes)) for name, heap, indexes in rows}


def where_the_bytes_are(by_table: dict[str, tuple[int, int]], total: int, top: int = 6) -> str:
    largest = sorted(by_table.items(), key=lambda item: -sum(item[1]))[:top]
    return ", ".join(
        f"{name} {size(heap)} + indexes {size(indexes)} ({(heap + indexes) / total:.0%})"
        for name, (heap, indexes) in largest
    )


def parquet_files(place: Place) -> list[Path]:
    return sorted((place.parquet_dir / "trajectories" / "train").glob("*.parquet"))


# --- the questions ------------------------------------------------------------------------


@dataclass(frozen=True)
class Question:
    name: str
    sql: str  # over artstore's views
    duckdb: str  # over `{files}`: read_parquet(..., filename = true)
    leading_run: bool  # the view query's first column is the run (checked, then dropped)


def _duckdb_step(offset: int) -> str:
    number = r"CAST(regexp_extract(filename, '(\d+)\.parquet$', 1) AS INTEGER)"
    return f"{number} - {offset}" if offset else number


QUESTIONS = (
    Question(
        "reward curve",
        (QUERIES / "reward_curve.sql").read_text(),
        f"""
        SELECT {_duckdb_step(1)} AS policy_step, COUNT(*), AVG(reward), MIN(reward), MAX(reward)
        FROM {{files}}
        GROUP BY policy_step ORDER BY policy_step""",
        leading_run=True,
    ),
    Question(
        "train-step reward",
        "SELECT step, num_trajectories, reward_mean FROM v_train_steps\n"
        "WHERE status = 'completed' ORDER BY step",
        f"""
        SELECT {_duckdb_step(0)} AS step, COUNT(*), AVG(reward)
        FROM {{files}}
        GROUP BY step ORDER BY step""",
        leading_run=False,
    ),
    Question(
        "tokens per step",
        (QUERIES / "tokens_per_step.sql").read_text(),
        f"""
        WITH t AS (
            SELECT {_duckdb_step(1)} AS policy_step,
                CAST(metrics ->> '$.num_llm_calls' AS BIGINT) AS calls,
                CAST(metrics ->> '$.prompt_tokens' AS BIGINT) AS prompt,
                CAST(metrics ->> '$.completion_tokens' AS BIGINT) AS completion,
                CAST(metrics ->> '$.llm_latency_s' AS DOUBLE) AS latency
            FROM {{files}}
        )
        SELECT policy_step, SUM(calls), COUNT(*), SUM(prompt), SUM(completion),
            SUM(prompt + completion), SUM(prompt + completion) / COUNT(*),
            SUM(latency) / SUM(calls)
        FROM t GROUP BY policy_step ORDER BY policy_step""",
        leading_run=True,
    ),
)


def _polars_steps(frame: pl.LazyFrame, offset: int) -> pl.LazyFrame:
    number = pl.col("file").str.extract(r"(\d+)\.parquet$").cast(pl.Int64)
    return frame.with_columns((number - offset).alias("step"))


def _polars_metric(name: str, dtype: type[pl.DataType]) -> pl.Expr:
    return pl.col("metrics").str.json_path_match(f"$.{name}").cast(dtype).alias(name)


def polars_query(name: str, glob: str) -> pl.LazyFrame:
    """The parquet side of question `name` in polars (the same numbers as the DuckDB SQL)."""
    files = pl.scan_parquet(glob, include_file_paths="file")
    if name == "reward curve":
        return (
            _polars_steps(files, 1)
            .group_by("step")
            .agg(
                pl.len(),
                pl.col("reward").mean().alias("mean"),
                pl.col("reward").min().alias("min"),
                pl.col("reward").max().alias("max"),
            )
            .sort("step")
        )
    if name == "train-step reward":
        return (
            _polars_steps(files, 0)
            .group_by("step")
            .agg(pl.len(), pl.col("reward").mean().alias("mean"))
            .sort("step")
        )
    tokens = (pl.col("prompt_tokens") + pl.col("completion_tokens")).alias("total")
    return (
        _polars_steps(files, 1)
        .select(
            "step",
            _polars_metric("num_llm_calls", pl.Int64),
            _polars_metric("prompt_tokens", pl.Int64),
            _polars_metric("completion_tokens", pl.Int64),
            _polars_metric("llm_latency_s", pl.Float64),
        )
        .with_columns(tokens)
        .group_by("step")
        .agg(
            pl.col("num_llm_calls").sum(),
            pl.len(),
            pl.col("prompt_tokens").sum(),
            pl.col("completion_tokens").sum(),
            pl.col("total").sum(),
            (pl.col("total").sum() / pl.len()).alias("per_rollout"),
            (pl.col("llm_latency_s").sum() / pl.col("num_llm_calls").sum()).alias("latency"),
        )
        .sort("step")
    )


Rows = list[tuple[Any, ...]]


def plain_value(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return value


def normalised(rows: Sequence[Sequence[Any]], question: Question, from_views: bool) -> Rows:
    """Rows as plain Python values, without the run column of the view queries."""
    found = []
    for row in rows:
        values = [plain_value(v) for v in row]
        if from_views and question.leading_run:
            run, *values = values
            if run != RUN:
                raise AssertionError(f"{question.name}: unexpected run {run!r}")
        found.append(tuple(values))
    return found


def same_rows(a: Rows, b: Rows) -> str | None:
    """None when `a` and `b` hold the same numbers, else what differs first."""
    if len(a) != len(b):
        return f"{len(a)} rows against {len(b)}"
    for number, (x, y) in enumerate(zip(a, b, strict=True)):
        if len(x) != len(y):
            return f"row {number}: {len(x)} columns against {len(y)}"
        for u, v in zip(x, y, strict=True):
            if isinstance(u, float) or isinstance(v, float):
                if u is None or v is None or not math.isclose(u, v, rel_tol=REL_TOL):
                    return f"row {number}: {x} against {y}"
            elif u != v:
                return f"row {number}: {x} against {y}"
    return None


# --- the engines --------------------------------------------------------------------------


class Engine(ABC):
    name: str

    @abstractmethod
    async def run(self, question: Question) -> Rows: ...

    async def close(self) -> None:
        return None


class ArtstoreEngine(Engine):
    """`artstore.analysis.query(store, sql)`: what `artstore sql` and users' scripts run."""

    def __init__(self, name: str, store: artstore.Store) -> None:
        self.name, self.store = name, store

    async def run(self, question: Question) -> Rows:
        result = await query(self.store, question.sql)
        return normalised(result.rows, question, from_views=True)


class SqliteEngine(Engine):
    """The same SQL on one sqlite3 connection kept open (the database's own time)."""

    name = "sqlite3"

    def __init__(self, path: Path) -> None:
        self.connection = sqlite3.connect(path)
        try:
            self.connection.execute("SELECT sqrt(4.0)")
        except sqlite3.OperationalError:  # the views use sqrt (artstore registers it too)
            self.connection.create_function("sqrt", 1, math.sqrt, deterministic=True)

    async def run(self, question: Question) -> Rows:
        rows = self.connection.execute(question.sql).fetchall()
        return normalised(rows, question, from_views=True)

    async def close(self) -> None:
        self.connection.close()


class PsycopgEngine(Engine):
    """The same SQL on one psycopg connection kept open (the database's own time)."""

    name = "psycopg"

    def __init__(self, conninfo: str) -> None:
        self.connection = psycopg.connect(conninfo, autocommit=True)

    async def run(self, question: Question) -> Rows:
        rows = self.connection.execute(question.sql).fetchall()  # type: ignore[arg-type]
        return normalised(rows, question, from_views=True)

    async def close(self) -> None:
        self.connection.close()


class DuckdbEngine(Engine):
    name = "duckdb parquet"

    def __init__(self, place: Place) -> None:
        self.connection = duckdb.connect(":memory:")
        glob = place.parquet_dir / "trajectories" / "train" / "*.parquet"
        self.files = f"read_parquet('{glob}', filename = true)"

    async def run(self, question: Question) -> Rows:
        rows = self.connection.execute(question.duckdb.format(files=self.files)).fetchall()
        return normalised(rows, question, from_views=False)

    async def close(self) -> None:
        self.connection.close()


class PolarsEngine(Engine):
    name = "polars parquet"

    def __init__(self, place: Place) -> None:
        self.glob = str(place.parquet_dir / "trajectories" / "train" / "*.parquet")

    async def run(self, question: Question) -> Rows:
        rows = polars_query(question.name, self.glob).collect().rows()
        return normalised(rows, question, from_views=False)


# --- measuring ----------------------------------------------------------------------------


@dataclass
class Timing:
    first: float = 0.0
    rounds: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.rounds)


async def timed(engine: Engine, question: Question) -> tuple[float, Rows]:
    start = time.perf_counter()
    rows = await engine.run(question)
    return time.perf_counter() - start, rows


async def measure(
    engines: list[Engine], repeat: int, console: Console
) -> dict[tuple[str, str], Timing]:
    """First run of every (question, engine), results checked equal; then `repeat` rounds."""
    timings: dict[tuple[str, str], Timing] = {}
    for question in QUESTIONS:
        reference: Rows | None = None
        for engine in engines:
            seconds, rows = await timed(engine, question)
            timings[question.name, engine.name] = Timing(first=seconds)
            if reference is None:
                reference = rows
                if not rows:
                    raise AssertionError(f"{question.name}: {engine.name} returned no rows")
            elif (difference := same_rows(reference, rows)) is not None:
                raise AssertionError(
                    f"{question.name}: {engine.name} disagrees with {engines[0].name}: {difference}"
                )
        console.print(
            f"  {question.name}: {len(reference or [])} rows, the same from all "
            f"{len(engines)} engines"
        )
    for number in range(repeat):
        shift = number % len(engines)
        for engine in engines[shift:] + engines[:shift]:
            for question in QUESTIONS:
                seconds, _ = await timed(engine, question)
                timings[question.name, engine.name].rounds.append(seconds)
    return timings


# --- reporting ----------------------------------------------------------------------------


def size(value: int) -> str:
    return f"{value / 2**20:.1f} MiB"


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}" if seconds < 1 else f"{seconds * 1000:,.0f}"


def ratio(value: float, reference: float | None) -> str:
    return "" if reference is None else f"x {value / reference:.2f}"


def report(
    timings: dict[tuple[str, str], Timing],
    engines: list[Engine],
    repeat: int,
    console: Console,
) -> None:
    table = Table(
        title=f"Analysis queries, median of {repeat} warm rounds (ms)",
        caption="first: the first run of that query by that engine in this process",
    )
    for column in ("question", "engine"):
        table.add_column(column, no_wrap=True)
    for column in ("first ms", "median ms", "vs artstore sqlite", "vs duckdb"):
        table.add_column(column, justify="right", no_wrap=True)
    names = [engine.name for engine in engines]
    for question in QUESTIONS:
        base = timings.get((question.name, "artstore sqlite"))
        duck = timings.get((question.name, "duckdb parquet"))
        for i, name in enumerate(names):
            timing = timings[question.name, name]
            table.add_row(
                question.name if i == 0 else "",
                name,
                ms(timing.first),
                ms(timing.median),
                ratio(timing.median, base.median if base else None),
                ratio(timing.median, duck.median if duck else None),
                end_section=i == len(names) - 1,
            )
    console.print(table)


def verdict(passed: bool) -> str:
    return "[green]PASS[/green]" if passed else "[red]MISS[/red]"


def one_by_one_rates(
    args: argparse.Namespace, console: Console, import_file: Path
) -> record_baseline.BaselineRun | None:
    """The recording target's peer, run now on the same run (and importing `import_file`),
    or None (not run)."""
    if not args.baseline:
        return None
    if not record_baseline.available(ONE_BY_ONE_COMMIT):
        console.print(
            f"the one-statement-per-event peer ({ONE_BY_ONE_COMMIT[:12]}) is not in this "
            "checkout's history: recording is compared with the rates measured for issue 13"
        )
        return None
    start = time.perf_counter()
    try:
        run = record_baseline.record(
            ONE_BY_ONE_COMMIT,
            rollouts=args.rollouts,
            seed=args.seed,
            databases=args.databases,
            postgres_url=args.postgres_url,
            import_file=import_file,
        )
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        console.print(f"{exc}: recording is compared with the rates measured for issue 13")
        return None
    console.print(
        f"recorded the same run with the one-statement-per-event artstore "
        f"({ONE_BY_ONE_COMMIT[:12]}, from git history): "
        + ", ".join(f"{database} {rate:,.0f} events/s" for database, rate in run.rates.items())
        + "; imported its JSONL export: "
        + ", ".join(f"{database} {s:.1f} s" for database, s in run.import_seconds.items())
        + f" ({time.perf_counter() - start:.0f} s)"
    )
    return run


async def timed_imports(
    databases: Sequence[str], place: Place, import_file: Path, console: Console
) -> dict[str, float]:
    """Seconds `artstore import` of the run's JSONL export takes, into a fresh database
    of each kind (what `import_path` does for the command)."""
    seconds: dict[str, float] = {}
    for database in databases:
        if database == "sqlite":
            url = f"sqlite:///{place.folder / 'imported.db'}"
        else:
            url = place.postgres_database()
        async with await artstore.open_store(url) as store:
            start, cpu = time.perf_counter(), time.process_time()
            summary = await import_path(store, import_file)
            seconds[database] = time.perf_counter() - start
            console.print(
                f"imported the JSONL export into {database}: {summary.written_rollouts:,} "
                f"rollouts in {seconds[database]:.1f} s ({store.transactions} transactions; "
                f"this process's CPU {time.process_time() - cpu:.1f} s)"
            )
    return seconds


def targets(
    timings: dict[tuple[str, str], Timing],
    recording: dict[str, float],
    imports: dict[str, float],
    baseline: record_baseline.BaselineRun | None,
    sizes: dict[str, int],
    parquet: int,
    console: Console,
) -> None:
    """One PASS/MISS line per target of issue 13."""
    console.print("[bold]targets[/bold]")
    for database, rate in recording.items():
        if baseline is not None:
            reference, note = baseline.rates[database], " (measured in this run)"
        else:
            reference = ONE_BY_ONE_EVENTS_PER_S[database]
            note = " (measured for issue 13 at 10,000 rollouts, another day)"
        console.print(
            f"  {verdict(rate >= RECORDING_TARGET * reference)} recording on {database}: "
            f"{rate:,.0f} ev/s vs {reference:,.0f} ev/s one statement per event = "
            f"{rate / reference:.2f}x (needs {RECORDING_TARGET:.0f}x){note}"
        )
    for database, seconds in imports.items():
        before = baseline.import_seconds.get(database) if baseline is not None else None
        if before is None:
            console.print(f"  (import on {database}: {seconds:.1f} s; no peer measured)")
            continue
        console.print(
            f"  {verdict(before >= RECORDING_TARGET * seconds)} import on {database}: "
            f"{seconds:.1f} s vs {before:.1f} s one statement per event = "
            f"{before / seconds:.2f}x as fast (needs {RECORDING_TARGET:.0f}x, as recording)"
        )
    for database in recording:
        for question in QUESTIONS:
            mine = timings[question.name, f"artstore {database}"].median
            duck = timings[question.name, "duckdb parquet"].median
            console.print(
                f"  {verdict(mine <= ANALYSIS_TARGET * duck)} {question.name} on {database}: "
                f"{ms(mine)} ms vs DuckDB {ms(duck)} ms = x {mine / duck:.2f} "
                f"(needs x {ANALYSIS_TARGET:.0f} at most)"
            )
    for database, stored in sizes.items():
        console.print(
            f"  {verdict(stored <= SIZE_TARGET * parquet)} {database} size: {size(stored)} vs "
            f"ART parquet {size(parquet)} = x {stored / parquet:.1f} "
            f"(needs x {SIZE_TARGET:.0f} at most)"
        )


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} CPUs"


# --- main ---------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--databases",
        default="sqlite,postgresql",
        help="comma-separated: sqlite, postgresql (default both)",
    )
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("ARTSTORE_BENCH_POSTGRES_URL", DEFAULT_POSTGRES_URL),
        help="a PostgreSQL server where the user may create databases "
        f"(default $ARTSTORE_BENCH_POSTGRES_URL or {DEFAULT_POSTGRES_URL})",
    )
    parser.add_argument(
        "--rollouts",
        type=int,
        default=None,
        help=f"rollouts in the run, a multiple of {ROLLOUTS_PER_STEP} (default 10000)",
    )
    parser.add_argument("--repeat", type=int, default=None, help="timed rounds (default 7)")
    parser.add_argument("--quick", action="store_true", help="1,000 rollouts and 3 rounds")
    parser.add_argument("--seed", type=int, default=5, help="of the generated data")
    parser.add_argument(
        "--sqlite-analyze",
        action="store_true",
        help="run ANALYZE on the SQLite file before measuring (artstore itself does not)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the SQLite file, parquet and PG database"
    )
    parser.add_argument(
        "--baseline",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"record the same run with the one-statement-per-event artstore of "
        f"{ONE_BY_ONE_COMMIT[:12]}, side by side (default: at {BASELINE_MAX_ROLLOUTS:,} "
        "rollouts or fewer)",
    )
    args = parser.parse_args(argv)
    args.databases = [d.strip() for d in args.databases.split(",") if d.strip()]
    unknown = set(args.databases) - set(DATABASES)
    if unknown or not args.databases:
        parser.error(f"--databases takes sqlite and/or postgresql, not {sorted(unknown)}")
    args.rollouts = args.rollouts or (1000 if args.quick else 10000)
    args.repeat = args.repeat or (3 if args.quick else 7)
    if args.rollouts <= 0 or args.rollouts % ROLLOUTS_PER_STEP:
        parser.error(f"--rollouts must be a positive multiple of {ROLLOUTS_PER_STEP}")
    if args.baseline is None:
        args.baseline = args.rollouts <= BASELINE_MAX_ROLLOUTS
    return args


async def timed_recording(
    store: artstore.Store, plan: Plan, database: str, console: Console
) -> float:
    """Record the planned run into `store`; the events per second it took."""
    start, cpu = time.perf_counter(), time.process_time()
    await record(store, plan)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    # CPU time of this process (all its threads; not PostgreSQL's server): what the
    # other sessions on a shared machine do not change as much as the wall clock.
    console.print(
        f"recorded on {database}: {seconds:.1f} s ({plan.events / seconds:,.0f} events/s, "
        f"{store.transactions} transactions; this process's CPU {cpu:.1f} s = "
        f"{plan.events / cpu:,.0f} events per CPU second)"
    )
    return plan.events / seconds


def raw_engine(
    database: str, place: Place, conninfo: str, analyze_sqlite: bool, console: Console
) -> Engine:
    """The driver alone on the recorded database, its planner statistics gathered (always
    on PostgreSQL; on SQLite only with --sqlite-analyze, since artstore does not)."""
    if database == "sqlite":
        if analyze_sqlite:
            with sqlite3.connect(place.sqlite_file) as connection:
                connection.execute("ANALYZE")
            console.print("ran ANALYZE on the SQLite file (--sqlite-analyze)")
        return SqliteEngine(place.sqlite_file)
    with psycopg.connect(conninfo, autocommit=True) as connection:
        connection.execute("ANALYZE")
    return PsycopgEngine(conninfo)


def print_sizes(
    by_database: dict[str, tuple[artstore.Store, Engine, str]], place: Place, console: Console
) -> tuple[dict[str, int], int]:
    """Print each database's size and its largest tables, and the parquet files' size;
    return (bytes by database, parquet bytes)."""
    sizes: list[tuple[str, int]] = []
    database_sizes: dict[str, int] = {}
    breakdown: list[str] = []
    for database, (_, _, conninfo) in by_database.items():
        if database == "sqlite":
            database_sizes[database] = sqlite_bytes(place.sqlite_file)
            sizes.append(("SQLite file (after checkpoint)", database_sizes[database]))
            by_table = sqlite_bytes_by_table(place.sqlite_file)
        else:
            database_sizes[database] = postgres_bytes(conninfo)
            sizes.append(("PostgreSQL database", database_sizes[database]))
            by_table = postgres_bytes_by_table(conninfo)
        total = database_sizes[database]
        breakdown.append(f"  {database}: {where_the_bytes_are(by_table, total)}")
    parquet = sum(p.stat().st_size for p in parquet_files(place))
    sizes.append((f"ART parquet files (format {parquet_format_version()})", parquet))
    console.print("sizes: " + ", ".join(f"{what} {size(n)}" for what, n in sizes))
    console.print("where the bytes are (largest tables, each with its indexes):")
    for line in breakdown:
        console.print(line)
    return database_sizes, parquet


async def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 120)
    place = Place(args.postgres_url)
    stores: list[artstore.Store] = []
    engines: list[Engine] = []
    try:
        console.print(f"[bold]bench_queries[/]: {load()}")
        start = time.perf_counter()
        plan = plan_run(args.rollouts // ROLLOUTS_PER_STEP, args.seed)
        console.print(
            f"planned {plan.rollouts:,} rollouts ({plan.steps} steps x {GROUPS_PER_STEP} groups "
            f"x {GROUP_SIZE}, {CALLS_PER_ROLLOUT} LLM calls each): {plan.events:,} events in "
            f"{len(plan.appends):,} appends, built in {time.perf_counter() - start:.1f} s"
        )
        recording: dict[str, float] = {}
        by_database: dict[str, tuple[artstore.Store, Engine, str]] = {}
        for database in args.databases:
            conninfo = "" if database == "sqlite" else place.postgres_database()
            store = await artstore.open_store(
                f"sqlite:///{place.sqlite_file}" if database == "sqlite" else conninfo
            )
            stores.append(store)
            recording[database] = await timed_recording(store, plan, database, console)
            raw = raw_engine(database, place, conninfo, args.sqlite_analyze, console)
            by_database[database] = (store, raw, conninfo)
        # The run as `artstore export --format jsonl` writes it: what both imports read.
        import_file = place.folder / "run.jsonl"
        await export_jsonl(stores[0], RUN, import_file)
        baseline = one_by_one_rates(args, console, import_file)
        imports = await timed_imports(args.databases, place, import_file, console)

        start = time.perf_counter()
        summary = await export_parquet(stores[0], RUN, place.parquet_dir)
        console.print(
            f"exported from {args.databases[0]} to ART's parquet: {len(summary.files)} files, "
            f"{summary.trajectories:,} trajectories in {time.perf_counter() - start:.1f} s"
        )
        if summary.trajectories != plan.rollouts or len(summary.files) != plan.steps:
            raise AssertionError(f"the export is incomplete: {summary}")

        for database, (store, raw, _) in by_database.items():
            engines += [ArtstoreEngine(f"artstore {database}", store), raw]
        database_sizes, parquet = print_sizes(by_database, place, console)
        engines += [DuckdbEngine(place), PolarsEngine(place)]

        console.print(f"checking results, then {args.repeat} rounds ({load()})")
        timings = await measure(engines, args.repeat, console)
        report(timings, engines, args.repeat, console)
        targets(timings, recording, imports, baseline, database_sizes, parquet, console)
        console.print(f"after: {load()}")
        if args.keep:
            console.print(
                f"kept: {place.folder} (SQLite file, parquet/), PostgreSQL databases "
                f"{', '.join(place.created) or '(none)'}"
            )
        return 0
    finally:
        for engine in engines:
            await engine.close()
        for store in stores:
            await store.close()
        if not args.keep:
            place.clean()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
