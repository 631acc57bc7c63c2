//! One node of the Galera cluster SIGKILLed while consumers on every node
//! deliver: a binary of its own, so that no other test runs while a node
//! is down. Needs the cluster of `scripts/galera-cluster.sh` (it kills and
//! restarts a node through that script) and `INBOX_TEST_GALERA_URLS`.
#![cfg_attr(not(feature = "mysql"), allow(unused))]

mod common;
mod support;
#[cfg(feature = "mysql")]
use common::galera_hot as hot;

#[cfg(feature = "mysql")]
mod failover {
    use crate::common::backends::galera::{fresh, nodes, on_node, open_node};
    use crate::hot::{self, ErrorType};
    use diesel::{Connection, MysqlConnection};
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    const MESSAGES: usize = 400;
    const KILLED: usize = 3;

    fn script(args: &[&str]) -> String {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/galera-cluster.sh");
        let out = std::process::Command::new("bash")
            .arg(path)
            .args(args)
            .output()
            .expect("run scripts/galera-cluster.sh");
        assert!(
            out.status.success(),
            "galera-cluster.sh {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// A connection to the first node, from `from` on, that answers.
    fn connect_from(db: &str, from: usize, count: usize) -> (usize, MysqlConnection) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            for k in 0..count {
                let node = (from + k) % count;
                if let Ok(conn) = MysqlConnection::establish(&on_node(db, node)) {
                    return (node, conn);
                }
            }
            assert!(Instant::now() < deadline, "no node answered for 60 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Consumers on every node share one queue (a broker); a delivery that
    /// fails goes back on the queue and its consumer reconnects to the
    /// next node that answers. A third of the way in, node 3 is SIGKILLed:
    /// its consumer gets an error (no hang, no panic), including when its
    /// COMMIT's outcome is unknown (then the write may have committed
    /// cluster-wide and the redelivery reports `Duplicate`). The node then
    /// rejoins, and the state is exact on all three.
    #[test]
    #[cfg_attr(
        not(inbox_test_galera),
        ignore = "INBOX_TEST_GALERA_URLS was not set when the tests were built: start a cluster with scripts/galera-cluster.sh start, set INBOX_TEST_GALERA_URLS=$(scripts/galera-cluster.sh urls) and run cargo test --all-features"
    )]
    fn a_node_killed_mid_run_loses_nothing() {
        if crate::support::skip_slow() {
            return;
        }
        let Some(nodes) = nodes() else { return };
        if script(&["urls"]) != nodes.join(",") {
            crate::common::skipped(
                "a_node_killed_mid_run_loses_nothing: INBOX_TEST_GALERA_URLS is not the cluster of scripts/galera-cluster.sh, which the test kills a node of",
            );
            return;
        }
        let count = nodes.len();
        let db = fresh("galera_failover").expect("a database");
        hot::set_up(&db);
        let run = crate::common::unique_run_id("failover");
        let payments = hot::payments(&run, MESSAGES);
        // Every third payment is delivered twice (a lost ack).
        let mut stream: VecDeque<hot::Payment> = VecDeque::new();
        for (i, p) in payments.iter().enumerate() {
            stream.push_back(p.clone());
            if i % 3 == 0 {
                stream.push_back(p.clone());
            }
        }
        let queue = Arc::new(Mutex::new(stream));
        let deliveries = queue.lock().expect("queue").len();
        let done = Arc::new(AtomicUsize::new(0));
        // The consumers wait at two thirds of the deliveries until the
        // node is dead: a quick run (a warm cache, few other tests) could
        // otherwise finish before the kill lands, and see no error.
        let killed = Arc::new(AtomicBool::new(false));
        let consumers: Vec<_> = (0..count)
            .map(|i| {
                let (db, queue, done) = (db.url.clone(), queue.clone(), done.clone());
                let killed = killed.clone();
                std::thread::spawn(move || {
                    let (mut node, mut conn) = connect_from(&db, i, count);
                    let (mut applied, mut errors) = (Vec::new(), Vec::new());
                    loop {
                        while !killed.load(Ordering::SeqCst)
                            && done.load(Ordering::SeqCst) >= deliveries * 2 / 3
                        {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        let Some(p) = queue.lock().expect("queue").pop_front() else {
                            break;
                        };
                        // One consumer (one dedup scope) on every node.
                        match ErrorType::App.deliver(&mut conn, &p) {
                            Ok(first) => {
                                if first {
                                    applied.push((p.id.clone(), node + 1));
                                }
                                done.fetch_add(1, Ordering::SeqCst);
                            }
                            Err(e) => {
                                errors.push((node + 1, e));
                                // Not acked: the broker redelivers it.
                                queue.lock().expect("queue").push_back(p);
                                (node, conn) = connect_from(&db, node + 1, count);
                            }
                        }
                    }
                    (applied, errors)
                })
            })
            .collect();
        // The kill, a third of the way in.
        let deadline = Instant::now() + Duration::from_secs(120);
        while done.load(Ordering::SeqCst) < MESSAGES / 3 {
            assert!(Instant::now() < deadline, "the consumers made no progress");
            std::thread::sleep(Duration::from_millis(5));
        }
        script(&["kill", &KILLED.to_string()]);
        killed.store(true, Ordering::SeqCst);
        let mut applied = Vec::new();
        let mut errors = Vec::new();
        for c in consumers {
            let (a, e) = c.join().expect("no consumer panicked");
            applied.extend(a);
            errors.extend(e);
        }
        script(&["rejoin", &KILLED.to_string()]);

        applied.sort();
        let twice: Vec<_> = applied
            .windows(2)
            .filter(|w| w[0].0 == w[1].0)
            .map(|w| (w[0].clone(), w[1].clone()))
            .collect();
        assert_eq!(
            twice,
            vec![],
            "applied twice (key, node), errors: {errors:?}"
        );
        // A delivery whose COMMIT outcome was unknown (the node died during
        // it) may have committed: its redelivery then reports `Duplicate`,
        // and no delivery reported `Applied` for it. Each such message is
        // one of the errors.
        assert!(applied.len() <= MESSAGES);
        assert!(
            MESSAGES - applied.len() <= errors.len(),
            "{} payments never reported Applied, with {} errors: {errors:?}",
            MESSAGES - applied.len(),
            errors.len()
        );
        assert!(
            errors.iter().any(|(node, _)| *node == KILLED),
            "the consumer on node {KILLED} saw its node die: {errors:?}"
        );
        // The errors came from the dead node's connections only.
        for (node, e) in &errors {
            assert_eq!(*node, KILLED, "an error on a live node: {e}");
        }
        eprintln!(
            "a_node_killed_mid_run_loses_nothing: errors on node {KILLED}: {:?}",
            errors.iter().map(|(_, e)| e).collect::<Vec<_>>()
        );
        hot::assert_state_on_every_node(&db, &hot::expected(&payments), MESSAGES);
        // The rejoined node serves handlers again.
        let mut conn = open_node(&on_node(&db, KILLED - 1));
        let extra = hot::Payment {
            id: format!("{run}-after"),
            account: 0,
            amount: 1,
        };
        assert_eq!(ErrorType::App.deliver(&mut conn, &extra), Ok(true));
        assert_eq!(ErrorType::App.deliver(&mut conn, &extra), Ok(false));
    }
}
