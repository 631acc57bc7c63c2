//! The fault scenarios, stamped out once per connection type.

diesel::table! {
    /// The durable "broker": a message stays until a worker acks it.
    inbox_fault_queue (run_id, seq) {
        run_id -> Text,
        seq -> BigInt,
        message_key -> Text,
        amount -> BigInt,
        deliveries -> Integer,
        acked -> Bool,
    }
}

diesel::table! {
    /// Shared counters that concurrent handlers update (conflicts on purpose).
    inbox_fault_counters (name) {
        name -> Text,
        value -> BigInt,
    }
}

pub const QUEUE_DDL: &str = "CREATE TABLE IF NOT EXISTS inbox_fault_queue (\
    run_id VARCHAR(64) NOT NULL, seq BIGINT NOT NULL, message_key VARCHAR(255) NOT NULL, \
    amount BIGINT NOT NULL, deliveries INTEGER NOT NULL DEFAULT 0, \
    acked BOOLEAN NOT NULL DEFAULT FALSE, PRIMARY KEY (run_id, seq))";

pub const COUNTERS_DDL: &str = "CREATE TABLE IF NOT EXISTS inbox_fault_counters (\
    name VARCHAR(128) NOT NULL PRIMARY KEY, value BIGINT NOT NULL)";

macro_rules! fault_backend {
    ($module:ident, $Conn:ty) => {
        pub mod $module {
            use crate::common::inbox_test_effects as effects;
            use crate::connections::FaultConnection;
            use crate::scenarios::{inbox_fault_counters as counters, inbox_fault_queue as queue};
            use crate::{
                delivery_stream, expected_effects, fault_run_id, message, CrashPoint,
                Message, Outcome, ScenarioResult, CONSUMER,
            };
            use diesel::connection::SimpleConnection;
            use diesel::prelude::*;
            use diesel_inbox::{idempotent, inbox_messages, ErrorClass, InboxError, InvalidKey, Processed};
            use std::process::{Command, Stdio};
            use std::sync::atomic::{AtomicU32, Ordering};
            use std::sync::{mpsc, Arc, Barrier};
            use std::time::Duration;

            type Conn = $Conn;
            const BACKEND: &str = stringify!($module);
            const LABEL: &str = <Conn as FaultConnection>::LABEL;

            pub fn scenarios() -> Vec<(&'static str, fn(&str) -> ScenarioResult)> {
                vec![
                    ("many_processes", many_processes),
                    ("crash_at_every_point", crash_at_every_point),
                    ("connection_killed_mid_transaction", connection_killed_mid_transaction),
                    ("serializable_overlapping_writes", serializable_overlapping_writes),
                    ("serialization_failure_retried_then_exhausted", serialization_failure_retried_then_exhausted),
                    ("deadlock_retried", deadlock_retried),
                    ("bad_input", bad_input),
                    ("least_privilege", least_privilege),
                    ("nested_and_long_transactions", nested_and_long_transactions),
                    ("randomized_schedules", randomized_schedules),
                ]
            }

            // ---- shared pieces -------------------------------------------------

            fn write_effect(conn: &mut Conn, run: &str, key: &str, amount: i64) -> QueryResult<usize> {
                diesel::insert_into(effects::table)
                    .values((effects::run_id.eq(run), effects::message_key.eq(key), effects::amount.eq(amount)))
                    .execute(conn)
            }

            /// The fault handler: two business rows per message, and an abort
            /// wherever the worker was told to crash.
            #[idempotent(key = "msg.key", consumer = "fault-consumer", shared, retries = 10)]
            pub fn consume(conn: &mut Conn, msg: &Message, crash: Option<CrashPoint>) -> QueryResult<()> {
                if crash == Some(CrashPoint::AfterClaim) {
                    std::process::abort();
                }
                write_effect(conn, &msg.run, &msg.key, msg.amount)?;
                if crash == Some(CrashPoint::MidBody) {
                    std::process::abort();
                }
                write_effect(conn, &msg.run, &format!("{}/second", msg.key), 0)?;
                Ok(())
            }

            fn setup(url: &str) -> Result<Conn, String> {
                let mut conn = Conn::open(url);
                diesel_inbox::migrate(&mut conn).map_err(|e| format!("migrate: {e}"))?;
                for ddl in [crate::common::EFFECTS_DDL, crate::scenarios::QUEUE_DDL, crate::scenarios::COUNTERS_DDL] {
                    conn.batch_execute(ddl).map_err(|e| format!("{ddl}: {e}"))?;
                }
                Ok(conn)
            }

            fn effects_of(conn: &mut Conn, run: &str) -> Vec<(String, i64)> {
                let mut rows: Vec<(String, i64)> = effects::table
                    .filter(effects::run_id.eq(run))
                    .select((effects::message_key, effects::amount))
                    .load(conn)
                    .expect("load effects");
                rows.sort();
                rows
            }

            fn inbox_rows(conn: &mut Conn, consumer: &str, run: &str) -> i64 {
                inbox_messages::table
                    .filter(inbox_messages::consumer.eq(consumer))
                    .filter(inbox_messages::message_id.like(format!("{run}:%")))
                    .count()
                    .get_result(conn)
                    .expect("count inbox rows")
            }

            /// Business rows and inbox rows equal one application of `seqs`.
            fn check_exact(conn: &mut Conn, run: &str, seqs: impl IntoIterator<Item = i64> + Clone) -> Result<(), String> {
                let expected = expected_effects(run, seqs.clone());
                let actual = effects_of(conn, run);
                if actual != expected {
                    let doubled = actual.windows(2).filter(|w| w[0] == w[1]).count();
                    return Err(format!(
                        "business rows differ: {} expected, {} found ({doubled} doubled)",
                        expected.len(),
                        actual.len()
                    ));
                }
                let inbox = inbox_rows(conn, CONSUMER, run);
                let distinct = seqs.into_iter().count() as i64;
                ensure!(inbox == distinct, "{inbox} inbox rows for {distinct} messages");
                Ok(())
            }

            fn spawn_worker(role: &str, envs: &[(&str, String)]) -> Command {
                let mut cmd = Command::new(std::env::current_exe().expect("own executable"));
                cmd.env("INBOX_FAULT_ROLE", role).env("INBOX_FAULT_BACKEND", BACKEND);
                for (k, v) in envs {
                    cmd.env(k, v);
                }
                cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
                cmd
            }

            fn env_var(name: &str) -> String {
                std::env::var(name).unwrap_or_else(|_| panic!("worker needs {name}"))
            }

            fn env_num(name: &str) -> usize {
                env_var(name).parse().unwrap_or_else(|_| panic!("{name} is a number"))
            }

            pub fn worker(role: &str) -> i32 {
                match role {
                    "stream" => stream_worker(),
                    "queue" => queue_worker(),
                    other => {
                        eprintln!("unknown worker role {other}");
                        2
                    }
                }
            }

            // ---- 1. many processes, one database -------------------------------

            const STREAM_SEED: u64 = 0x5eed;

            /// Consumes its share of the shared stream with several threads and
            /// prints `applied=A duplicates=D errors=E`.
            fn stream_worker() -> i32 {
                let (url, run) = (env_var("INBOX_FAULT_URL"), env_var("INBOX_FAULT_RUN"));
                let (index, workers, threads) = (env_num("INBOX_FAULT_INDEX"), env_num("INBOX_FAULT_WORKERS"), env_num("INBOX_FAULT_THREADS"));
                let stream = delivery_stream(env_num("INBOX_FAULT_MESSAGES"), env_num("INBOX_FAULT_DUPLICATES"), STREAM_SEED);
                let mine: Vec<i64> = stream.iter().enumerate().filter(|(i, _)| i % workers == index).map(|(_, s)| *s).collect();
                let mine = Arc::new(mine);
                let handles: Vec<_> = (0..threads)
                    .map(|t| {
                        let (url, run, mine) = (url.clone(), run.clone(), mine.clone());
                        std::thread::spawn(move || {
                            let mut conn = Conn::open(&url);
                            let (mut applied, mut duplicates, mut errors) = (0u64, 0u64, Vec::new());
                            for (j, seq) in mine.iter().enumerate() {
                                if j % threads != t {
                                    continue;
                                }
                                match consume(&mut conn, &message(&run, *seq), None) {
                                    Ok(Processed::Applied(())) => applied += 1,
                                    Ok(Processed::Duplicate) => duplicates += 1,
                                    Err(e) => errors.push(format!("{seq}: {e}")),
                                }
                            }
                            (applied, duplicates, errors)
                        })
                    })
                    .collect();
                let (mut applied, mut duplicates, mut errors) = (0, 0, Vec::new());
                for h in handles {
                    let (a, d, e) = h.join().expect("worker thread");
                    applied += a;
                    duplicates += d;
                    errors.extend(e);
                }
                for e in errors.iter().take(5) {
                    eprintln!("error: {e}");
                }
                println!("applied={applied} duplicates={duplicates} errors={}", errors.len());
                0
            }

            fn many_processes(server: &str) -> ScenarioResult {
                const PROCESSES: usize = 4;
                const THREADS: usize = 2;
                const MESSAGES: usize = 5_000;
                const DUPLICATE_PERCENT: usize = 30;
                let url = Conn::scenario_database(server);
                let mut conn = setup(&url)?;
                let run = fault_run_id();
                let stream_len = delivery_stream(MESSAGES, DUPLICATE_PERCENT, STREAM_SEED).len();
                let children: Vec<_> = (0..PROCESSES)
                    .map(|index| {
                        spawn_worker("stream", &[
                            ("INBOX_FAULT_URL", url.clone()),
                            ("INBOX_FAULT_RUN", run.clone()),
                            ("INBOX_FAULT_INDEX", index.to_string()),
                            ("INBOX_FAULT_WORKERS", PROCESSES.to_string()),
                            ("INBOX_FAULT_THREADS", THREADS.to_string()),
                            ("INBOX_FAULT_MESSAGES", MESSAGES.to_string()),
                            ("INBOX_FAULT_DUPLICATES", DUPLICATE_PERCENT.to_string()),
                        ])
                        .spawn()
                        .map_err(|e| format!("spawn worker: {e}"))
                    })
                    .collect::<Result<_, _>>()?;
                let (mut applied, mut duplicates, mut errors) = (0usize, 0usize, 0usize);
                for child in children {
                    let out = child.wait_with_output().map_err(|e| e.to_string())?;
                    let stdout = String::from_utf8_lossy(&out.stdout);
                    ensure!(out.status.success(), "worker failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
                    let line = stdout.lines().find(|l| l.starts_with("applied=")).ok_or("worker printed no counts")?;
                    let nums: Vec<usize> = line
                        .split_whitespace()
                        .filter_map(|kv| kv.split('=').nth(1)?.parse().ok())
                        .collect();
                    ensure!(nums.len() == 3, "bad worker line {line}");
                    applied += nums[0];
                    duplicates += nums[1];
                    errors += nums[2];
                    if nums[2] > 0 {
                        eprintln!("{}", String::from_utf8_lossy(&out.stderr));
                    }
                }
                ensure!(errors == 0, "{errors} deliveries failed");
                ensure!(applied == MESSAGES, "{applied} applied for {MESSAGES} messages");
                ensure!(applied + duplicates == stream_len, "{} outcomes for {stream_len} deliveries", applied + duplicates);
                check_exact(&mut conn, &run, 0..MESSAGES as i64)?;
                drop(conn);
                Conn::discard(&url);
                Ok(Outcome::Pass(format!(
                    "| {LABEL} | many processes, one database | {PROCESSES} processes × {THREADS} threads | {MESSAGES} ({stream_len} deliveries) | {DUPLICATE_PERCENT}% duplicates, shuffled, delivered concurrently | {applied} applied, {duplicates} duplicates, 0 errors; business rows exact |"
                )))
            }

            // ---- 2. crash at every point ---------------------------------------

            /// Takes unacked messages in order, marks each delivery, handles it,
            /// acks it; aborts at `INBOX_FAULT_CRASH` on the first delivery of
            /// every fifth message.
            fn queue_worker() -> i32 {
                let (url, run) = (env_var("INBOX_FAULT_URL"), env_var("INBOX_FAULT_RUN"));
                let point = CrashPoint::parse(&env_var("INBOX_FAULT_CRASH")).expect("a crash point");
                let mut conn = Conn::open(&url);
                loop {
                    let next = conn.transaction(|c| {
                        let row: Option<(i64, i32)> = queue::table
                            .filter(queue::run_id.eq(&run))
                            .filter(queue::acked.eq(false))
                            .order(queue::seq)
                            .select((queue::seq, queue::deliveries))
                            .first(c)
                            .optional()?;
                        if let Some((seq, _)) = row {
                            diesel::update(queue::table.find((&run, seq)))
                                .set(queue::deliveries.eq(queue::deliveries + 1))
                                .execute(c)?;
                        }
                        Ok::<_, diesel::result::Error>(row)
                    });
                    let (seq, earlier_deliveries) = match next {
                        Ok(Some(row)) => row,
                        Ok(None) => return 0,
                        Err(e) => {
                            eprintln!("receive failed: {e}");
                            return 3;
                        }
                    };
                    let crash = (earlier_deliveries == 0 && seq % 5 == 0).then_some(point);
                    if crash == Some(CrashPoint::BeforeClaim) {
                        std::process::abort();
                    }
                    if let Err(e) = consume(&mut conn, &message(&run, seq), crash) {
                        eprintln!("handler failed on {seq}: {e}");
                        return 4;
                    }
                    if crash == Some(CrashPoint::AfterCommit) {
                        std::process::abort();
                    }
                    let acked = conn.transaction(|c| {
                        diesel::update(queue::table.find((&run, seq)))
                            .set(queue::acked.eq(true))
                            .execute(c)?;
                        if crash == Some(CrashPoint::DuringAck) {
                            std::process::abort();
                        }
                        Ok::<_, diesel::result::Error>(())
                    });
                    if let Err(e) = acked {
                        eprintln!("ack failed on {seq}: {e}");
                        return 5;
                    }
                }
            }

            fn crash_at_every_point(server: &str) -> ScenarioResult {
                use std::os::unix::process::ExitStatusExt;
                const MESSAGES: i64 = 200;
                let url = Conn::scenario_database(server);
                let mut conn = setup(&url)?;
                let mut crashes_by_point = Vec::new();
                for point in CrashPoint::ALL {
                    let run = fault_run_id();
                    let rows: Vec<_> = (0..MESSAGES)
                        .map(|seq| {
                            let m = message(&run, seq);
                            (queue::run_id.eq(run.clone()), queue::seq.eq(seq), queue::message_key.eq(m.key), queue::amount.eq(m.amount))
                        })
                        .collect();
                    diesel::insert_into(queue::table).values(&rows).execute(&mut conn).map_err(|e| e.to_string())?;
                    let mut crashes = 0;
                    loop {
                        ensure!(crashes <= MESSAGES, "{}: workers keep crashing", point.name());
                        let out = spawn_worker("queue", &[
                            ("INBOX_FAULT_URL", url.clone()),
                            ("INBOX_FAULT_RUN", run.clone()),
                            ("INBOX_FAULT_CRASH", point.name().to_string()),
                        ])
                        .output()
                        .map_err(|e| format!("spawn worker: {e}"))?;
                        if out.status.success() {
                            break;
                        }
                        ensure!(
                            out.status.signal() == Some(6),
                            "{}: worker failed ({}): {}",
                            point.name(),
                            out.status,
                            String::from_utf8_lossy(&out.stderr)
                        );
                        crashes += 1;
                    }
                    ensure!(crashes == MESSAGES / 5, "{}: {crashes} crashes, expected {}", point.name(), MESSAGES / 5);
                    let unacked: i64 = queue::table
                        .filter(queue::run_id.eq(&run))
                        .filter(queue::acked.eq(false))
                        .count()
                        .get_result(&mut conn)
                        .map_err(|e| e.to_string())?;
                    ensure!(unacked == 0, "{}: {unacked} messages never acked", point.name());
                    check_exact(&mut conn, &run, 0..MESSAGES).map_err(|e| format!("{}: {e}", point.name()))?;
                    crashes_by_point.push(format!("{} {crashes}", point.name()));
                }
                drop(conn);
                Conn::discard(&url);
                Ok(Outcome::Pass(format!(
                    "| {LABEL} | crash at every point | 1 worker process at a time, restarted after each abort | {MESSAGES} per crash point | `abort()` on the first delivery of every 5th message: {} | every message acked, applied once; business rows exact |",
                    crashes_by_point.join(", ")
                )))
            }

            // ---- 3. connection killed mid-transaction --------------------------

            #[idempotent(key = "msg.key", consumer = "fault-consumer", shared, retries = 0)]
            fn write_wait_write(conn: &mut Conn, msg: &Message, started: mpsc::Sender<()>) -> QueryResult<()> {
                write_effect(conn, &msg.run, &msg.key, msg.amount)?;
                let _ = started.send(());
                std::thread::sleep(Duration::from_millis(700));
                write_effect(conn, &msg.run, &format!("{}/second", msg.key), 0)?;
                Ok(())
            }

            fn connection_killed_mid_transaction(server: &str) -> ScenarioResult {
                let url = Conn::scenario_database(server);
                let mut admin = setup(&url)?;
                let Some(_) = Conn::open(&url).session_id() else {
                    Conn::discard(&url);
                    return Ok(Outcome::Skip("an embedded database has no session to kill".into()));
                };
                const ROUNDS: i64 = 5;
                let run = fault_run_id();
                for seq in 0..ROUNDS {
                    let mut victim = Conn::open(&url);
                    let id = victim.session_id().ok_or("no session id")?;
                    let (started_tx, started_rx) = mpsc::channel();
                    let (done_tx, done_rx) = mpsc::channel();
                    let run2 = run.clone();
                    let handler = std::thread::spawn(move || {
                        let result = write_wait_write(&mut victim, &message(&run2, seq), started_tx);
                        let _ = done_tx.send(result.map_err(|e| e.to_string()));
                    });
                    started_rx.recv_timeout(Duration::from_secs(10)).map_err(|_| "the body never started")?;
                    admin.kill(id).map_err(|e| format!("kill: {e}"))?;
                    let result = done_rx
                        .recv_timeout(Duration::from_secs(30))
                        .map_err(|_| "the handler hung after its connection was killed")?;
                    ensure!(handler.join().is_ok(), "the handler panicked");
                    ensure!(result.is_err(), "the handler reported success on a killed connection");
                    let key = message(&run, seq).key;
                    let second = format!("{key}/second");
                    ensure!(
                        !effects_of(&mut admin, &run).iter().any(|(k, _)| *k == key || *k == second),
                        "a killed transaction left business rows"
                    );
                    ensure!(inbox_rows(&mut admin, CONSUMER, &run) == seq, "a killed transaction left its inbox row");
                    // The broker redelivers to a fresh connection.
                    let mut fresh = Conn::open(&url);
                    let again = consume(&mut fresh, &message(&run, seq), None).map_err(|e| e.to_string())?;
                    ensure!(again.is_applied(), "the redelivery was not applied");
                    let once_more = consume(&mut fresh, &message(&run, seq), None).map_err(|e| e.to_string())?;
                    ensure!(once_more.is_duplicate(), "the second redelivery applied again");
                    // Clear this round's rows from the check of the next one.
                    check_exact(&mut admin, &run, 0..=seq)?;
                }
                Ok(Outcome::Pass(format!(
                    "| {LABEL} | connection killed mid-transaction | 1 handler + 1 killer session | {ROUNDS} | session killed (`{}`) while the body runs | handler returned an error (no panic, no hang), nothing written; redelivery applied once |",
                    if BACKEND == "postgres" { "pg_terminate_backend" } else { "KILL" }
                )))
            }

            // ---- 4. retryable conflicts ----------------------------------------

            fn counter(conn: &mut Conn, name: &str) -> QueryResult<i64> {
                counters::table.find(name).select(counters::value).first(conn)
            }

            fn new_counter(conn: &mut Conn, name: &str) -> Result<(), String> {
                diesel::insert_into(counters::table)
                    .values((counters::name.eq(name), counters::value.eq(0_i64)))
                    .execute(conn)
                    .map(drop)
                    .map_err(|e| e.to_string())
            }

            fn add(conn: &mut Conn, name: &str, amount: i64) -> QueryResult<usize> {
                diesel::update(counters::table.find(name))
                    .set(counters::value.eq(counters::value + amount))
                    .execute(conn)
            }

            static BODY_RUNS: AtomicU32 = AtomicU32::new(0);

            #[idempotent(key = "msg.key", consumer = "fault-counter", shared, retries = 100)]
            fn add_to_shared_counter(conn: &mut Conn, msg: &Message) -> QueryResult<()> {
                BODY_RUNS.fetch_add(1, Ordering::SeqCst);
                add(conn, &format!("{}:total", msg.run), msg.amount)?;
                write_effect(conn, &msg.run, &msg.key, msg.amount).map(drop)
            }

            fn serializable_overlapping_writes(server: &str) -> ScenarioResult {
                if BACKEND != "postgres" {
                    return Ok(Outcome::Skip("SERIALIZABLE snapshot isolation is PostgreSQL's".into()));
                }
                const THREADS: usize = 4;
                const MESSAGES: i64 = 100;
                let url = Conn::scenario_database(server);
                let mut conn = setup(&url)?;
                let run = fault_run_id();
                new_counter(&mut conn, &format!("{run}:total"))?;
                BODY_RUNS.store(0, Ordering::SeqCst);
                let barrier = Arc::new(Barrier::new(THREADS));
                let workers: Vec<_> = (0..THREADS)
                    .map(|t| {
                        let (url, run, barrier) = (url.clone(), run.clone(), barrier.clone());
                        std::thread::spawn(move || -> Result<(usize, usize), String> {
                            let mut conn = Conn::open(&url);
                            conn.batch_execute("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE")
                                .map_err(|e| e.to_string())?;
                            barrier.wait();
                            let (mut applied, mut duplicates) = (0, 0);
                            for n in 0..MESSAGES {
                                let seq = (n + t as i64 * MESSAGES / THREADS as i64) % MESSAGES;
                                match add_to_shared_counter(&mut conn, &message(&run, seq)) {
                                    Ok(Processed::Applied(())) => applied += 1,
                                    Ok(Processed::Duplicate) => duplicates += 1,
                                    Err(e) => return Err(format!("{seq}: {e}")),
                                }
                            }
                            Ok((applied, duplicates))
                        })
                    })
                    .collect();
                let (mut applied, mut duplicates) = (0, 0);
                for w in workers {
                    let (a, d) = w.join().map_err(|_| "worker panicked")??;
                    applied += a;
                    duplicates += d;
                }
                let runs = BODY_RUNS.load(Ordering::SeqCst) as i64;
                let expected_total: i64 = (0..MESSAGES).map(|s| message(&run, s).amount).sum();
                let total = counter(&mut conn, &format!("{run}:total")).map_err(|e| e.to_string())?;
                ensure!(applied == MESSAGES as usize, "{applied} applied");
                ensure!(duplicates == (THREADS - 1) * MESSAGES as usize, "{duplicates} duplicates");
                ensure!(total == expected_total, "counter {total}, expected {expected_total}");
                ensure!(effects_of(&mut conn, &run).len() == MESSAGES as usize, "business rows not exact");
                ensure!(runs > MESSAGES, "no serialization failure happened ({runs} body runs): the scenario proved nothing");
                Ok(Outcome::Pass(format!(
                    "| {LABEL} | SERIALIZABLE handlers, overlapping writes | {THREADS} threads | {MESSAGES} × {THREADS} deliveries | every body updates one shared row | {} serialization failures retried; counter and business rows exact, no errors |",
                    runs - MESSAGES
                )))
            }

            /// Another session changes the row after this transaction's snapshot
            /// (taken at the claim) on the first `interfere` attempts.
            #[idempotent(key = "msg.key", consumer = "fault-interfered", shared, conn = "conn", retries = 2)]
            fn interfered(conn: &mut Conn, msg: &Message, other: &mut Conn, interfere: u32, runs: &AtomicU32) -> QueryResult<()> {
                let attempt = runs.fetch_add(1, Ordering::SeqCst) + 1;
                let name = format!("{}:total", msg.run);
                if attempt <= interfere {
                    add(other, &name, 1000)?;
                }
                add(conn, &name, msg.amount).map(drop)
            }

            fn serialization_failure_retried_then_exhausted(server: &str) -> ScenarioResult {
                if BACKEND != "postgres" {
                    return Ok(Outcome::Skip("SERIALIZABLE snapshot isolation is PostgreSQL's".into()));
                }
                let url = Conn::scenario_database(server);
                let mut conn = setup(&url)?;
                conn.batch_execute("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE")
                    .map_err(|e| e.to_string())?;
                let mut other = Conn::open(&url);
                let run = fault_run_id();
                new_counter(&mut conn, &format!("{run}:total"))?;

                // Interfered once: the second attempt commits.
                let runs = AtomicU32::new(0);
                let first = message(&run, 1);
                let out = interfered(&mut conn, &first, &mut other, 1, &runs).map_err(|e| e.to_string())?;
                ensure!(out.is_applied(), "not applied after one retry");
                ensure!(runs.load(Ordering::SeqCst) == 2, "{} attempts, expected 2", runs.load(Ordering::SeqCst));
                let total = counter(&mut conn, &format!("{run}:total")).map_err(|e| e.to_string())?;
                ensure!(total == 1000 + first.amount, "counter {total}");

                // Interfered every time: 1 + retries attempts, then an error naming them.
                let runs = AtomicU32::new(0);
                let second = message(&run, 2);
                let err = match interfered(&mut conn, &second, &mut other, u32::MAX, &runs) {
                    Err(e) => e,
                    Ok(p) => return Err(format!("expected exhaustion, got {p:?}")),
                };
                let inbox = match &err {
                    diesel::result::Error::QueryBuilderError(inner) => inner.downcast_ref::<InboxError>(),
                    _ => None,
                };
                ensure!(
                    matches!(inbox, Some(InboxError::RetriesExhausted { attempts: 3, .. })),
                    "expected RetriesExhausted after 3 attempts, got {err:?}"
                );
                ensure!(runs.load(Ordering::SeqCst) == 3, "{} attempts", runs.load(Ordering::SeqCst));
                ensure!(inbox_rows(&mut conn, "fault-interfered", &run) == 1, "the exhausted message left an inbox row");
                Ok(Outcome::Pass(format!(
                    "| {LABEL} | forced serialization failure (40001) | 2 sessions | 2 | a concurrent update after the snapshot, once / on every attempt | applied on attempt 2; then `{err}` |"
                )))
            }

            /// The README's kind of error type: only `Debug`, no
            /// `RetryableError`. A deadlock in the body reaches the runtime
            /// only as this, yet it is retried (the runtime observes the
            /// failed statement).
            #[derive(Debug)]
            #[allow(dead_code)] // read through Debug
            pub enum PlainError {
                Db(diesel::result::Error),
                Inbox(InboxError),
            }
            impl From<diesel::result::Error> for PlainError {
                fn from(e: diesel::result::Error) -> Self {
                    PlainError::Db(e)
                }
            }
            impl From<InboxError> for PlainError {
                fn from(e: InboxError) -> Self {
                    PlainError::Inbox(e)
                }
            }

            /// Locks `first` then `second`; both handlers meet at the barrier on
            /// their first attempt, holding one row each: a deadlock.
            #[idempotent(key = "msg.key", consumer = "fault-deadlock", shared, retries = 5)]
            fn lock_two(conn: &mut Conn, msg: &Message, first: &str, second: &str, meet: &Barrier, runs: &AtomicU32) -> Result<(), PlainError> {
                let attempt = runs.fetch_add(1, Ordering::SeqCst) + 1;
                add(conn, first, 1)?;
                if attempt == 1 {
                    meet.wait();
                }
                add(conn, second, 1)?;
                write_effect(conn, &msg.run, &msg.key, msg.amount)?;
                Ok(())
            }

            #[idempotent(key = "msg.key", consumer = "fault-dupkey", shared, retries = 0)]
            fn hold_then_fail(conn: &mut Conn, msg: &Message, claimed: mpsc::Sender<()>) -> QueryResult<()> {
                let _ = claimed.send(());
                std::thread::sleep(Duration::from_millis(400));
                let _ = (conn, msg);
                Err(diesel::result::Error::RollbackTransaction)
            }

            #[idempotent(key = "msg.key", consumer = "fault-dupkey", shared, retries = 10)]
            fn dupkey_apply(conn: &mut Conn, msg: &Message) -> QueryResult<()> {
                write_effect(conn, &msg.run, &msg.key, msg.amount).map(drop)
            }

            fn innodb_deadlocks(conn: &mut Conn) -> i64 {
                #[derive(QueryableByName)]
                struct Status {
                    #[diesel(sql_type = diesel::sql_types::Text)]
                    #[diesel(column_name = Value)]
                    value: String,
                }
                diesel::sql_query("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'")
                    .load::<Status>(conn)
                    .ok()
                    .and_then(|rows| rows.first().and_then(|r| r.value.parse().ok()))
                    .unwrap_or(0)
            }

            fn deadlock_retried(server: &str) -> ScenarioResult {
                match BACKEND {
                    "postgres" => postgres_deadlock(server),
                    "mysql" => mysql_duplicate_key_deadlock(server),
                    _ => Ok(Outcome::Skip("SQLite serializes writers: no deadlock".into())),
                }
            }

            fn postgres_deadlock(server: &str) -> ScenarioResult {
                const ROUNDS: i64 = 3;
                let url = Conn::scenario_database(server);
                let mut conn = setup(&url)?;
                let run = fault_run_id();
                let (x, y) = (format!("{run}:x"), format!("{run}:y"));
                new_counter(&mut conn, &x)?;
                new_counter(&mut conn, &y)?;
                let mut retried = 0;
                for round in 0..ROUNDS {
                    let meet = Arc::new(Barrier::new(2));
                    let pair: Vec<_> = [(x.clone(), y.clone()), (y.clone(), x.clone())]
                        .into_iter()
                        .enumerate()
                        .map(|(i, (first, second))| {
                            let (url, run, meet) = (url.clone(), run.clone(), meet.clone());
                            std::thread::spawn(move || {
                                let runs = AtomicU32::new(0);
                                let mut conn = Conn::open(&url);
                                let out = lock_two(&mut conn, &message(&run, round * 2 + i as i64), &first, &second, &meet, &runs);
                                (out.map_err(|e| format!("{e:?}")), runs.load(Ordering::SeqCst))
                            })
                        })
                        .collect();
                    for handle in pair {
                        let (out, runs) = handle.join().map_err(|_| "handler panicked")?;
                        ensure!(matches!(out, Ok(Processed::Applied(()))), "round {round}: {out:?}");
                        retried += runs - 1;
                    }
                }
                ensure!(retried >= ROUNDS as u32, "{retried} retries for {ROUNDS} deadlocks");
                let (vx, vy) = (counter(&mut conn, &x).map_err(|e| e.to_string())?, counter(&mut conn, &y).map_err(|e| e.to_string())?);
                ensure!(vx == 2 * ROUNDS && vy == 2 * ROUNDS, "counters {vx}, {vy}");
                ensure!(effects_of(&mut conn, &run).len() == 2 * ROUNDS as usize, "business rows not exact");
                Ok(Outcome::Pass(format!(
                    "| {LABEL} | deadlock (40P01) | 2 sessions × {ROUNDS} rounds | {} | two handlers lock two rows in opposite order; their error type is a plain enum with only `Debug` | {retried} deadlock victims retried (seen by the runtime from the failed statement); all applied once, counters exact |",
                    2 * ROUNDS
                )))
            }

            fn mysql_duplicate_key_deadlock(server: &str) -> ScenarioResult {
                const ROUNDS: i64 = 10;
                let url = Conn::scenario_database(server);
                let mut conn = setup(&url)?;
                let run = fault_run_id();
                let before = innodb_deadlocks(&mut conn);
                for seq in 0..ROUNDS {
                    let (claimed_tx, claimed_rx) = mpsc::channel();
                    let holder = {
                        let (url, run) = (url.clone(), run.clone());
                        std::thread::spawn(move || {
                            let mut conn = Conn::open(&url);
                            hold_then_fail(&mut conn, &message(&run, seq), claimed_tx).map_err(|e| e.to_string())
                        })
                    };
                    claimed_rx.recv_timeout(Duration::from_secs(10)).map_err(|_| "the first session never claimed")?;
                    let waiters: Vec<_> = (0..2)
                        .map(|_| {
                            let (url, run) = (url.clone(), run.clone());
                            std::thread::spawn(move || {
                                let mut conn = Conn::open(&url);
                                dupkey_apply(&mut conn, &message(&run, seq)).map_err(|e| e.to_string())
                            })
                        })
                        .collect();
                    let first = holder.join().map_err(|_| "holder panicked")?;
                    ensure!(first.is_err(), "the holder was meant to roll back");
                    let outcomes: Vec<_> = waiters.into_iter().map(|w| w.join().map_err(|_| "waiter panicked".to_string())?).collect::<Result<_, String>>()?;
                    let applied = outcomes.iter().filter(|o| o.is_applied()).count();
                    ensure!(applied == 1, "round {seq}: {applied} of the two waiters applied ({outcomes:?})");
                }
                let deadlocks = innodb_deadlocks(&mut conn) - before;
                let rows = effects_of(&mut conn, &run);
                ensure!(rows.len() == ROUNDS as usize, "{} business rows for {ROUNDS} keys", rows.len());
                Ok(Outcome::Pass(format!(
                    "| {LABEL} | three-session duplicate-key deadlock | 3 sessions × {ROUNDS} rounds | {ROUNDS} | a claim rolled back while two redeliveries wait on it | {deadlocks} InnoDB deadlocks (1213) retried; exactly one waiter applied each round, no errors |"
                )))
            }

            // ---- 6. bad input --------------------------------------------------

            fn bad_input(server: &str) -> ScenarioResult {
                let url = Conn::scenario_database(server);
                let mut conn = setup(&url)?;
                let run = fault_run_id();
                let claim = |conn: &mut Conn, consumer: &str, key: &str| -> QueryResult<Processed<()>> {
                    diesel_inbox::run(conn, consumer, key, 0, |conn| write_effect(conn, &run, key, 1).map(drop), ErrorClass::of)
                };
                let long = |n: usize| format!("{run}:{}", "k".repeat(n));
                let multibyte = format!("{run}:{}", "é".repeat((256 - run.len()) / 2));
                let cases: Vec<(String, String, InboxError)> = vec![
                    ("fault-bad".into(), String::new(), InboxError::InvalidKey(InvalidKey::Empty)),
                    ("fault-bad".into(), long(256 - run.len()), InboxError::InvalidKey(InvalidKey::TooLong { len: 257 })),
                    ("fault-bad".into(), multibyte.clone(), InboxError::InvalidKey(InvalidKey::TooLong { len: multibyte.len() })),
                    ("fault-bad".into(), format!("{run}:a\0b"), InboxError::InvalidKey(InvalidKey::ContainsNul)),
                    (String::new(), format!("{run}:k"), InboxError::InvalidConsumer(InvalidKey::Empty)),
                    ("c".repeat(300), format!("{run}:k"), InboxError::InvalidConsumer(InvalidKey::TooLong { len: 300 })),
                    ("con\0sumer".into(), format!("{run}:k"), InboxError::InvalidConsumer(InvalidKey::ContainsNul)),
                ];
                ensure!(multibyte.len() > 255, "test key too short");
                for (consumer, key, expected) in &cases {
                    match claim(&mut conn, consumer, key) {
                        Err(diesel::result::Error::QueryBuilderError(inner)) => {
                            let got = inner.downcast_ref::<InboxError>().ok_or("not an InboxError")?;
                            ensure!(got.to_string() == expected.to_string(), "{key:?}: got {got}, expected {expected}");
                        }
                        other => return Err(format!("{consumer:?}/{key:?}: expected {expected}, got {other:?}")),
                    }
                }
                ensure!(effects_of(&mut conn, &run).is_empty(), "a refused key ran its body");
                ensure!(inbox_rows(&mut conn, "fault-bad", &run) == 0, "a refused key was stored");
                // Two keys equal in their first 255 bytes: both refused, never truncated into one.
                let a = format!("{}A", long(255 - run.len()));
                let b = format!("{}B", long(255 - run.len()));
                ensure!(claim(&mut conn, "fault-bad", &a).is_err() && claim(&mut conn, "fault-bad", &b).is_err(), "an over-long key was accepted");
                // Hostile but valid names and keys are stored verbatim; the connection still works.
                let hostile_consumer = "'; DROP TABLE inbox_messages; --";
                let exact = long(255 - run.len() - 1);
                for key in [format!("{run}:'); DELETE FROM inbox_messages; --"), format!("{run}:%_\\ \"q\" ünï"), exact.clone()] {
                    ensure!(claim(&mut conn, hostile_consumer, &key).map_err(|e| e.to_string())?.is_applied(), "{key:?} not applied");
                    ensure!(claim(&mut conn, hostile_consumer, &key).map_err(|e| e.to_string())?.is_duplicate(), "{key:?} applied twice");
                }
                ensure!(exact.len() == 255, "exact key is {} bytes", exact.len());
                let stored: Vec<String> = inbox_messages::table
                    .filter(inbox_messages::consumer.eq(hostile_consumer))
                    .filter(inbox_messages::message_id.eq(&exact))
                    .select(inbox_messages::message_id)
                    .load(&mut conn)
                    .map_err(|e| e.to_string())?;
                ensure!(stored == vec![exact.clone()], "the 255-byte key was not stored whole");
                drop(conn);
                Conn::discard(&url);
                Ok(Outcome::Pass(format!(
                    "| {LABEL} | bad input | 1 session | {} refused + 3 hostile | empty, 256-byte, multi-byte over 255, NUL keys and consumer names; keys equal in their first 255 bytes; SQL metacharacters | each refused with its `InboxError`, nothing written; hostile values stored verbatim; connection usable |",
                    cases.len() + 2
                )))
            }

            // ---- 7. least privilege --------------------------------------------

            fn least_privilege(server: &str) -> ScenarioResult {
                if BACKEND != "postgres" {
                    return Ok(Outcome::Skip("roles and grants are checked on PostgreSQL".into()));
                }
                let url = Conn::scenario_database(server);
                let mut admin = setup(&url)?;
                let run = fault_run_id();
                let role = format!("inbox_limited_{run}");
                let schema = format!("inbox_empty_{run}");
                admin
                    .batch_execute(&format!(
                        "CREATE ROLE {role} LOGIN PASSWORD '{role}'; \
                         GRANT USAGE ON SCHEMA public TO {role}; \
                         REVOKE CREATE ON SCHEMA public FROM PUBLIC; \
                         GRANT SELECT, INSERT, DELETE ON inbox_messages, inbox_test_effects TO {role}; \
                         CREATE SCHEMA {schema}; GRANT USAGE ON SCHEMA {schema} TO {role};"
                    ))
                    .map_err(|e| format!("create role: {e}"))?;
                let result = (|| -> Result<String, String> {
                    let (scheme, rest) = url.split_once("://").ok_or("a URL")?;
                    let host = rest.split_once('@').map_or(rest, |(_, host)| host);
                    // Its password is its name: the server may require one over TCP.
                    let limited_url = format!("{scheme}://{role}:{role}@{host}");
                    let mut limited = Conn::open(&limited_url);
                    diesel_inbox::migrate(&mut limited).map_err(|e| format!("migrate with the table present: {e}"))?;
                    for seq in 0..3 {
                        let out = consume(&mut limited, &message(&run, seq), None).map_err(|e| format!("handler: {e}"))?;
                        ensure!(out.is_applied(), "not applied");
                        ensure!(consume(&mut limited, &message(&run, seq), None).map_err(|e| e.to_string())?.is_duplicate(), "applied twice");
                    }
                    check_exact(&mut admin, &run, 0..3)?;
                    let separator = if limited_url.contains('?') { '&' } else { '?' };
                    let mut empty = Conn::open(&format!("{limited_url}{separator}options=-c%20search_path%3D{schema}"));
                    match diesel_inbox::migrate(&mut empty) {
                        Err(e @ InboxError::MigrationFailed(_)) => Ok(e.to_string()),
                        other => Err(format!("migrate without the table and without CREATE: {other:?}")),
                    }
                })();
                let _ = admin.batch_execute(&format!(
                    "DROP SCHEMA {schema} CASCADE; DROP OWNED BY {role}; DROP ROLE {role};"
                ));
                let message = result?;
                Ok(Outcome::Pass(format!(
                    "| {LABEL} | least privilege | 1 role with SELECT/INSERT/DELETE only | 3 | no DDL privilege | handlers work; `migrate` is a no-op with the table present and fails clearly without it: \"{}\" |",
                    message.replace('|', "/")
                )))
            }

            // ---- 8. nested and long transactions -------------------------------

            #[idempotent(key = "msg.key", consumer = "fault-long", shared, retries = 0)]
            fn long_body(conn: &mut Conn, msg: &Message, claimed: mpsc::Sender<()>, hold: Duration) -> QueryResult<()> {
                write_effect(conn, &msg.run, &msg.key, msg.amount)?;
                let _ = claimed.send(());
                std::thread::sleep(hold);
                Ok(())
            }

            #[idempotent(key = "msg.key", consumer = "fault-long", shared, retries = 30)]
            fn patient(conn: &mut Conn, msg: &Message) -> QueryResult<()> {
                write_effect(conn, &msg.run, &msg.key, msg.amount).map(drop)
            }

            fn nested_and_long_transactions(server: &str) -> ScenarioResult {
                let url = Conn::scenario_database(server);
                let mut conn = setup(&url)?;
                let run = fault_run_id();
                // Inside the caller's transaction, which then rolls back.
                let nested = message(&run, 0);
                let outer: QueryResult<()> = conn.transaction(|c| {
                    let out = consume(c, &nested, None)?;
                    assert!(out.is_applied());
                    Err(diesel::result::Error::RollbackTransaction)
                });
                ensure!(outer.is_err(), "the outer transaction committed");
                ensure!(effects_of(&mut conn, &run).is_empty(), "the outer rollback left business rows");
                ensure!(inbox_rows(&mut conn, CONSUMER, &run) == 0, "the outer rollback left the inbox row");
                ensure!(consume(&mut conn, &nested, None).map_err(|e| e.to_string())?.is_applied(), "redelivery not applied");
                check_exact(&mut conn, &run, 0..1)?;

                // A body that outlasts the waiter's lock wait: the waiter's
                // claim times out, is retried, and sees the outcome.
                let hold = Duration::from_millis(if BACKEND == "mysql" { 2500 } else { 1500 });
                let long = message(&run, 1);
                let (claimed_tx, claimed_rx) = mpsc::channel();
                let first = {
                    let (url, run) = (url.clone(), run.clone());
                    std::thread::spawn(move || {
                        let mut conn = Conn::open(&url);
                        long_body(&mut conn, &message(&run, 1), claimed_tx, hold).map_err(|e| e.to_string())
                    })
                };
                claimed_rx.recv_timeout(Duration::from_secs(10)).map_err(|_| "the long body never started")?;
                let mut waiter = Conn::open(&url);
                waiter.short_lock_wait().map_err(|e| e.to_string())?;
                let started = std::time::Instant::now();
                let second = patient(&mut waiter, &long).map_err(|e| format!("waiter: {e}"))?;
                let waited = started.elapsed();
                let first = first.join().map_err(|_| "long body panicked")??;
                ensure!(first.is_applied(), "the long body did not apply");
                ensure!(second.is_duplicate(), "the waiter applied a message the long body had applied");
                ensure!(waited >= hold / 2, "the waiter did not wait ({waited:?})");
                let rows = effects_of(&mut conn, &run);
                ensure!(rows.iter().filter(|(k, _)| *k == long.key).count() == 1, "long message applied {} times", rows.len());
                Ok(Outcome::Pass(format!(
                    "| {LABEL} | nested and long transactions | 2 sessions | 2 | handler inside a caller's transaction that rolls back; a body held {} ms against a {} lock wait | outer rollback removed the inbox row too, redelivery applied; the waiter's claim timed out, was retried and reported `Duplicate` after {} ms |",
                    hold.as_millis(),
                    if BACKEND == "mysql" { "1 s" } else { "300 ms" },
                    waited.as_millis()
                )))
            }

            // ---- 5. randomized schedules ---------------------------------------

            #[derive(Clone, Copy, Debug)]
            enum Fate {
                Acked,
                BodyFails,
                Panics,
                CrashAfterCommit,
            }

            #[idempotent(key = "msg.key", consumer = "fault-consumer", shared, retries = 3)]
            fn scheduled(conn: &mut Conn, msg: &Message, fate: Fate) -> QueryResult<()> {
                write_effect(conn, &msg.run, &msg.key, msg.amount)?;
                match fate {
                    Fate::BodyFails => Err(diesel::result::Error::RollbackTransaction),
                    Fate::Panics => panic!("injected panic"),
                    _ => write_effect(conn, &msg.run, &format!("{}/second", msg.key), 0).map(drop),
                }
            }

            fn randomized_schedules(server: &str) -> ScenarioResult {
                use proptest::prelude::*;
                use proptest::test_runner::{Config, TestRunner};
                const WORKERS: usize = 3;
                const MESSAGES: i64 = 6;
                let cases: u32 = std::env::var("INBOX_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(24);
                let url = Conn::scenario_database(server);
                let check = std::cell::RefCell::new(setup(&url)?);
                let workers = std::cell::RefCell::new((0..WORKERS).map(|_| Conn::open(&url)).collect::<Vec<Conn>>());
                let fate = prop_oneof![
                    4 => Just(Fate::Acked),
                    2 => Just(Fate::BodyFails),
                    1 => Just(Fate::Panics),
                    2 => Just(Fate::CrashAfterCommit),
                ];
                let step = (0..WORKERS, 0..MESSAGES, fate);
                let schedule = proptest::collection::vec(step, 1..40);
                let mut runner = TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() });
                let deliveries = std::cell::Cell::new(0usize);
                let prev_hook = std::panic::take_hook();
                // The injected panics are expected: keep them off stderr.
                std::panic::set_hook(Box::new(|_| {}));
                let result = runner.run(&schedule, |steps| {
                    let run = fault_run_id();
                    let mut acked = [false; MESSAGES as usize];
                    let mut workers = workers.borrow_mut();
                    // Whether the delivery ended in an ack.
                    let mut deliver = |worker: usize, seq: i64, fate: Fate| -> Result<bool, TestCaseError> {
                        deliveries.set(deliveries.get() + 1);
                        let conn = &mut workers[worker];
                        let out = std::panic::catch_unwind(AssertUnwindSafe(|| scheduled(conn, &message(&run, seq), fate)));
                        Ok(match (fate, out) {
                            (Fate::Panics, Err(_)) | (Fate::BodyFails, Ok(Err(_))) => false,
                            (Fate::Panics | Fate::BodyFails, Ok(Ok(Processed::Duplicate))) => true,
                            (Fate::Acked, Ok(Ok(_))) => true,
                            (Fate::CrashAfterCommit, Ok(Ok(_))) => false,
                            (fate, other) => {
                                prop_assert!(false, "{fate:?} delivery of {seq}: {:?}", other.map(|r| r.map_err(|e| e.to_string())));
                                false
                            }
                        })
                    };
                    for (worker, seq, fate) in steps {
                        if deliver(worker, seq, fate)? {
                            acked[seq as usize] = true;
                        }
                    }
                    // The broker redelivers everything not acked until it is.
                    for seq in 0..MESSAGES {
                        let mut worker = seq as usize;
                        while !acked[seq as usize] {
                            acked[seq as usize] = deliver(worker % WORKERS, seq, Fate::Acked)?;
                            worker += 1;
                        }
                    }
                    check_exact(&mut check.borrow_mut(), &run, 0..MESSAGES).map_err(TestCaseError::fail)?;
                    Ok(())
                });
                std::panic::set_hook(prev_hook);
                result.map_err(|e| format!("{e}"))?;
                drop(workers);
                drop(check);
                Conn::discard(&url);
                Ok(Outcome::Pass(format!(
                    "| {LABEL} | randomized schedules (proptest) | {WORKERS} connections, interleaved | {MESSAGES} per case, {cases} cases, {} deliveries | body errors, panics, crashes after commit, redeliveries in random order | invariant held in every case |",
                    deliveries.get()
                )))
            }

            use std::panic::AssertUnwindSafe;
        }
    };
}
