//! Amazon SQS on moto's server (PyPI `moto[server]`; not SQS itself, but
//! it keeps visibility timeouts, receive counts, redrive policies and FIFO
//! groups as SQS does): a standard queue with a dead-letter queue per
//! scenario (and a FIFO one for [`SqsFifo`]), publishing with the id in
//! the `message-id` attribute (a producer's resend gets a new SQS
//! `MessageId`), the runner deduplicating on it. Every client of the
//! consumer processes goes through a TCP proxy of the parent's, which
//! drops their connections or refuses them for an outage.

use crate::consumer::{block_on, runner_policy, Counts, Options};
use crate::scenarios::{
    applied_in_order, applied_so_far, check_exact, command, ensure, finish, finish_with_output,
    orders, spawn_consumer, start, wait_for_applied, Broker, Scenario,
};
use crate::support::proxy::{Mode, Proxy};
use aws_sdk_sqs::types::{QueueAttributeName, SendMessageBatchRequestEntry};
use std::sync::OnceLock;
use std::time::Duration;

pub struct Sqs;
/// The same scenarios on a FIFO queue (every order in one of eight
/// message groups).
pub struct SqsFifo;

/// What a killed consumer held comes back after this (the queue's
/// visibility timeout, in seconds): long enough for the heartbeat's
/// renewals to reach moto on a loaded machine.
pub const VISIBILITY: i32 = 4;
/// The variable that tells the consumer processes the proxy's URL.
const PROXY_VAR: &str = "INBOX_SQS_PROXY_URL";

/// A client of the SQS server at `endpoint` (a fixed region and test
/// credentials, plain HTTP).
pub fn client(endpoint: &str) -> aws_sdk_sqs::Client {
    use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "tests"))
        .endpoint_url(endpoint)
        .http_client(aws_smithy_http_client::Builder::new().build_http())
        .build();
    aws_sdk_sqs::Client::from_conf(config)
}

/// The parent's proxy in front of the server (started once; the consumer
/// processes inherit its URL through [`PROXY_VAR`]).
fn proxy(url: &str) -> Result<&'static Proxy, String> {
    static PROXY: OnceLock<Result<Proxy, String>> = OnceLock::new();
    PROXY
        .get_or_init(|| {
            let authority = url
                .trim_start_matches("http://")
                .trim_end_matches('/')
                .to_owned();
            let upstream = std::net::ToSocketAddrs::to_socket_addrs(&authority)
                .map_err(|e| format!("{url}: {e}"))?
                .next()
                .ok_or_else(|| format!("{url}: no address"))?;
            let proxy = Proxy::start(upstream)?;
            // Read by the child processes only, set before the first spawns.
            std::env::set_var(PROXY_VAR, format!("http://127.0.0.1:{}", proxy.port));
            Ok(proxy)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// The endpoint a consumer process uses: the parent's proxy.
pub fn endpoint(url: &str) -> String {
    std::env::var(PROXY_VAR).unwrap_or_else(|_| url.to_owned())
}

fn fifo_name(queue: &str, fifo: bool) -> String {
    match fifo {
        true => format!("{queue}.fifo"),
        false => queue.to_owned(),
    }
}

/// [`url_of`], asked again for up to 30 s: a consumer process restarted
/// while the proxy refuses connections (a drop, an outage) waits for it.
pub async fn queue_url(client: &aws_sdk_sqs::Client, name: &str) -> Result<String, String> {
    let began = std::time::Instant::now();
    loop {
        match url_of(client, name).await {
            Ok(url) => return Ok(url),
            Err(e) if began.elapsed() > Duration::from_secs(30) => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

async fn url_of(client: &aws_sdk_sqs::Client, name: &str) -> Result<String, String> {
    client
        .get_queue_url()
        .queue_name(name)
        .send()
        .await
        .map_err(|e| format!("{name}: {}", aws_sdk_sqs::error::DisplayErrorContext(e)))?
        .queue_url()
        .map(str::to_owned)
        .ok_or_else(|| format!("no URL for {name}"))
}

/// Creates `queue` (FIFO: `<queue>.fifo`) with the visibility timeout
/// [`VISIBILITY`] and a dead-letter queue `<queue>-dlq` that SQS moves a
/// message to after `max_receives` receives.
pub fn create(url: &str, queue: &str, fifo: bool, max_receives: u32) -> Result<(), String> {
    proxy(url)?;
    block_on(async {
        let client = client(url);
        let mut dlq = client
            .create_queue()
            .queue_name(fifo_name(&format!("{queue}-dlq"), fifo));
        if fifo {
            dlq = dlq.attributes(QueueAttributeName::FifoQueue, "true");
        }
        let dlq_url = dlq
            .send()
            .await
            .map_err(|e| {
                format!(
                    "create the dead-letter queue: {}",
                    aws_sdk_sqs::error::DisplayErrorContext(e)
                )
            })?
            .queue_url()
            .unwrap_or_default()
            .to_owned();
        let arn = client
            .get_queue_attributes()
            .queue_url(&dlq_url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await
            .map_err(|e| e.to_string())?
            .attributes()
            .and_then(|a| a.get(&QueueAttributeName::QueueArn).cloned())
            .ok_or("the dead-letter queue has no ARN")?;
        let mut create = client
            .create_queue()
            .queue_name(fifo_name(queue, fifo))
            .attributes(
                QueueAttributeName::VisibilityTimeout,
                VISIBILITY.to_string(),
            )
            .attributes(
                QueueAttributeName::RedrivePolicy,
                format!(r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":"{max_receives}"}}"#),
            );
        if fifo {
            create = create.attributes(QueueAttributeName::FifoQueue, "true");
        }
        create.send().await.map_err(|e| {
            format!(
                "create the queue: {}",
                aws_sdk_sqs::error::DisplayErrorContext(e)
            )
        })?;
        Ok(())
    })
}

/// The message group of an order id `<queue>-<seq>`: one of eight.
pub fn group_of(id: &str) -> String {
    let seq: u64 = id
        .rsplit('-')
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    format!("customer-{}", seq % 8)
}

/// Sends `(id, body)` in order, ten per request, the id in `message-id`
/// (FIFO: the group from [`group_of`], deduplicated on a fresh id, so a
/// second publish of an id is stored again).
pub fn send(
    url: &str,
    queue: &str,
    fifo: bool,
    messages: &[(String, Vec<u8>)],
) -> Result<(), String> {
    use aws_sdk_sqs::types::MessageAttributeValue;
    block_on(async {
        let client = client(url);
        let queue_url = url_of(&client, &fifo_name(queue, fifo)).await?;
        for (n, chunk) in messages.chunks(10).enumerate() {
            let mut entries = Vec::new();
            for (i, (id, body)) in chunk.iter().enumerate() {
                let mut entry = SendMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .message_body(String::from_utf8_lossy(body))
                    .message_attributes(
                        "message-id",
                        MessageAttributeValue::builder()
                            .data_type("String")
                            .string_value(id)
                            .build()
                            .map_err(|e| e.to_string())?,
                    );
                if fifo {
                    entry = entry
                        .message_group_id(group_of(id))
                        .message_deduplication_id(format!("{n}-{i}-{id}"));
                }
                entries.push(entry.build().map_err(|e| e.to_string())?);
            }
            let sent = client
                .send_message_batch()
                .queue_url(&queue_url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| format!("send: {}", aws_sdk_sqs::error::DisplayErrorContext(e)))?;
            if !sent.failed().is_empty() {
                return Err(format!("SQS refused {:?}", sent.failed()));
            }
        }
        Ok(())
    })
}

/// The visible, in-flight and delayed messages of the queue `name`.
pub async fn depth(client: &aws_sdk_sqs::Client, name: &str) -> Result<u64, String> {
    let url = url_of(client, name).await?;
    let answer = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesDelayed)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    Ok(answer
        .attributes()
        .map(|a| a.values().filter_map(|v| v.parse::<u64>().ok()).sum())
        .unwrap_or(0))
}

/// Checks that the dead-letter queue holds exactly one message and the
/// queue none.
fn one_dead_letter(url: &str, queue: &str, fifo: bool) -> Result<String, String> {
    block_on(async {
        let client = client(url);
        let dead = depth(&client, &fifo_name(&format!("{queue}-dlq"), fifo)).await?;
        let left = depth(&client, &fifo_name(queue, fifo)).await?;
        if dead != 1 || left != 0 {
            return Err(format!(
                "{dead} messages in the dead-letter queue, {left} left in the queue (expected 1 and 0)"
            ));
        }
        Ok("the dead-letter queue holds it; the queue is empty".into())
    })
}

fn remove(url: &str, queue: &str, fifo: bool) {
    let _ = block_on(async {
        let client = client(url);
        for name in [
            fifo_name(queue, fifo),
            fifo_name(&format!("{queue}-dlq"), fifo),
        ] {
            if let Ok(url) = url_of(&client, &name).await {
                let _ = client.delete_queue().queue_url(url).send().await;
            }
        }
        Ok::<(), String>(())
    });
}

/// Every connection through the proxy closed, and new ones refused for
/// `down` (at least a moment).
fn refuse(down: Duration) -> Result<String, String> {
    let proxy = proxy(&std::env::var("INBOX_TEST_SQS_URL").map_err(|e| e.to_string())?)?;
    proxy.set(Mode::Refuse);
    std::thread::sleep(down.max(Duration::from_millis(1500)));
    proxy.set(Mode::Forward);
    Ok(format!(
        "every connection to the SQS server closed, new ones refused for {:.1} s",
        down.max(Duration::from_millis(1500)).as_secs_f64()
    ))
}

/// The consumer process: the library's runner on the queue, through the
/// proxy, deduplicating on `message-id`; the scenario's own policy
/// unless it asked for the runner's. Killed between commit and delete
/// where the options say.
async fn consume(options: Options, fifo: bool) -> Result<Counts, String> {
    let shared = crate::consumer::Shared::new(&options.db).await?;
    let client = client(&endpoint(&options.url));
    let queue_url = queue_url(&client, &fifo_name(&options.queue, fifo)).await?;
    if crate::consumer::runner_mode() {
        let consumer = diesel_inbox::sqs::Consumer::new(client, queue_url, runner_policy())
            .id_attribute("message-id")
            .wait_time(Duration::from_secs(1));
        return shared.serve(consumer, &options).await;
    }
    // The scenario's own consumer: what a hand-written loop reports, line
    // by line (a duplicate; a failure the policy retries, with its time),
    // and the crash between commit and delete.
    let live = crate::live::install();
    // `INBOX_SQS_SLOW_MS`: orders 1 and 11 take that long (before their
    // transaction), longer than the visibility timeout.
    let slow = std::env::var("INBOX_SQS_SLOW_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map(Duration::from_millis);
    let failures = std::sync::Mutex::new(std::collections::HashMap::<String, u32>::new());
    let report = diesel_inbox::sqs::Consumer::new(client, queue_url, crate::consumer::policy())
        .id_attribute("message-id")
        .wait_time(Duration::from_secs(1))
        .in_flight(usize::from(options.prefetch))
        .run(
            async |id: &str, body: &[u8]| {
                if let Some(slow) = slow.filter(|_| id.ends_with("-1") || id.ends_with("-11")) {
                    tokio::time::sleep(slow).await;
                }
                let outcome = shared.apply(id, body).await;
                if options.crashes_at(id, 1, &outcome) {
                    crate::consumer::crash_now();
                }
                match &outcome {
                    Ok(diesel_inbox::Processed::Duplicate) => println!("duplicate {id}"),
                    Err(_) => {
                        let mut failures = failures.lock().unwrap();
                        let n = failures.entry(id.to_owned()).or_default();
                        *n += 1;
                        // The policy's fifth delivery is its last.
                        if *n < 5 {
                            let ms = std::time::SystemTime::now()
                                .duration_since(std::time::UNIX_EPOCH)
                                .map_or(0, |d| d.as_millis());
                            println!("retry {id} {ms}");
                        }
                    }
                    Ok(_) => {}
                }
                outcome
            },
            shared.stop(options.idle),
        )
        .await
        .map_err(|e| e.to_string())?;
    if let Some(live) = live {
        println!("{}", live.line());
    }
    Ok(shared.finish(&report))
}

impl Broker for Sqs {
    const NAME: &'static str = "sqs";
    const URL_VAR: &'static str = "INBOX_TEST_SQS_URL";
    const REDELIVERS_IN_PLACE: bool = false;
    const SCALE: u64 = 5;
    const SEES_DROPS: bool = false;
    const ORDERED: bool = false;
    // moto answers slowly on a loaded machine (CI compiles beside it: one
    // run saw three consumers all wait over 10 s at once): a consumer must
    // not take that for an empty queue.
    const IDLE_MS: u64 = 30_000;
    const ONLY: Option<&'static [&'static str]> = Some(&[
        "duplicates",
        "killed_between_commit_and_ack",
        "poison_is_dead_lettered",
        "three_consumers",
        "connection_dropped",
        "runner_stops_on_sigterm",
        "runner_survives_a_database_outage",
        "batches_isolate_a_bad_message",
        "bisection_dead_letters_nothing_healthy",
        "batches_killed_at_random",
        "runner_drains_then_exits",
        "outbox_chain_with_kills",
        "outbox_relay_survives_a_broker_outage",
    ]);

    fn own() -> Vec<Scenario> {
        vec![
            ("heartbeat_keeps_a_slow_handler_alone", heartbeat),
            ("redrive_moves_a_poison_message", redrive),
            ("runner_survives_a_hung_server", hung_server),
            ("intake_stops_at_sigterm", intake_stops_at_sigterm),
            (
                "poison_without_a_redrive_policy_is_parked",
                poison_without_a_redrive_policy_is_parked,
            ),
        ]
    }

    fn setup(url: &str, queue: &str) -> Result<(), String> {
        create(url, queue, false, 10)
    }

    fn setup_limited(url: &str, queue: &str, max_deliveries: u32) -> Result<(), String> {
        create(url, queue, false, max_deliveries)
    }

    fn publish(url: &str, queue: &str, messages: &[(String, Vec<u8>)]) -> Result<(), String> {
        send(url, queue, false, messages)
    }

    fn dead_lettered(url: &str, queue: &str) -> Result<String, String> {
        one_dead_letter(url, queue, false)
    }

    fn drop_connections() -> Result<String, String> {
        refuse(Duration::ZERO)
    }

    fn teardown(url: &str, queue: &str) {
        remove(url, queue, false);
    }

    fn consume() -> i32 {
        crate::consumer::run_process(|options| consume(options, false))
    }

    fn destination(queue: &str) -> String {
        queue.to_owned()
    }

    fn outage(down: Duration) -> Result<String, String> {
        refuse(down)
    }
}

impl Broker for SqsFifo {
    const NAME: &'static str = "sqs_fifo";
    const URL_VAR: &'static str = "INBOX_TEST_SQS_URL";
    const REDELIVERS_IN_PLACE: bool = false;
    const SCALE: u64 = 5;
    const SEES_DROPS: bool = false;
    const IDLE_MS: u64 = 30_000;
    const ONLY: Option<&'static [&'static str]> = Some(&[
        "killed_between_commit_and_ack",
        "poison_is_dead_lettered",
        "bisection_dead_letters_nothing_healthy",
        "batches_killed_at_random",
        "outbox_chain_with_kills",
    ]);

    fn own() -> Vec<Scenario> {
        vec![("group_order_under_kills", group_order)]
    }

    fn setup(url: &str, queue: &str) -> Result<(), String> {
        create(url, queue, true, 10)
    }

    fn setup_limited(url: &str, queue: &str, max_deliveries: u32) -> Result<(), String> {
        create(url, queue, true, max_deliveries)
    }

    fn publish(url: &str, queue: &str, messages: &[(String, Vec<u8>)]) -> Result<(), String> {
        send(url, queue, true, messages)
    }

    fn dead_lettered(url: &str, queue: &str) -> Result<String, String> {
        one_dead_letter(url, queue, true)
    }

    fn drop_connections() -> Result<String, String> {
        refuse(Duration::ZERO)
    }

    fn teardown(url: &str, queue: &str) {
        remove(url, queue, true);
    }

    fn consume() -> i32 {
        crate::consumer::run_process(|options| consume(options, true))
    }

    fn destination(queue: &str) -> String {
        format!("{queue}.fifo")
    }

    fn outage(down: Duration) -> Result<String, String> {
        refuse(down)
    }
}

// ---- SQS's own scenarios ------------------------------------------------

/// Two orders whose handler takes 10 s, past the queue's 4 s visibility
/// timeout, among 40 (8 in flight): the heartbeat keeps them invisible,
/// so none is delivered a second time while it runs; each applied once.
fn heartbeat(url: &str) -> Result<String, String> {
    let run = start::<Sqs>(url)?;
    publish_standard(url, &run.queue, &orders(&run, 40))?;
    let mut command = command::<Sqs>(&run, 8, 0, false)?;
    command.env("INBOX_SQS_SLOW_MS", "10000");
    let child = command
        .spawn()
        .map_err(|e| format!("spawn consumer: {e}"))?;
    let counts = finish(child)?.ok_or("the consumer was killed")?;
    check_exact(&run, 40)?;
    ensure!(
        counts.applied == 40 && counts.duplicates == 0,
        "a slow handler's message was delivered again while it ran: {counts:?}"
    );
    Ok(format!(
        "orders 1 and 11 ran 10 s each (visibility timeout {VISIBILITY} s), none delivered again meanwhile: {} applied, 0 duplicates; state exact",
        counts.applied
    ))
}

/// SIGTERM while four slow handlers (0.4 to 1.9 s each) are in flight and more
/// orders wait: intake stops at the signal, the handlers finish, and the
/// runner exits. Right after, no message is left invisible (a receive cut
/// short would leave its messages so for the visibility timeout), and
/// none of those left was received more than once before (the stopping
/// runner received nothing after the signal but its receive in flight,
/// whose messages it gave back at once). A second runner applies the rest.
fn intake_stops_at_sigterm(url: &str) -> Result<String, String> {
    use aws_sdk_sqs::types::MessageSystemAttributeName;
    const N: u64 = 60;
    let run = start::<Sqs>(url)?;
    publish_standard(url, &run.queue, &orders(&run, N))?;
    let mut command = command::<Sqs>(&run, 4, 0, true)?;
    // Staggered: as the handlers in flight at the signal finish one by
    // one, room for more frees while the others still run.
    command.env("INBOX_BROKER_SLOW_MS", "400,900,1400,1900");
    let child = command
        .spawn()
        .map_err(|e| format!("spawn consumer: {e}"))?;
    wait_for_applied(&run, 4)?;
    let epoch_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    };
    let signalled = epoch_ms();
    std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .map_err(|e| format!("kill -TERM: {e}"))?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    ensure!(
        out.status.success(),
        "the runner did not stop cleanly ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let applied = u64::try_from(applied_so_far(&run)).unwrap_or(0);
    let (invisible, counts) = block_on(async {
        let client = client(url);
        let queue_url = url_of(&client, &run.queue).await?;
        let invisible = client
            .get_queue_attributes()
            .queue_url(&queue_url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .map_err(|e| e.to_string())?
            .attributes()
            .and_then(|a| {
                a.get(&QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
                    .cloned()
            })
            .and_then(|n| n.parse::<u64>().ok())
            .ok_or("no count of invisible messages")?;
        // The messages left, each with how often it was received (this
        // receive included); made visible again for the second runner.
        let mut counts = Vec::new();
        let mut receipts = Vec::new();
        for _ in 0..20 {
            let answer = client
                .receive_message()
                .queue_url(&queue_url)
                .max_number_of_messages(10)
                .visibility_timeout(60)
                .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
                .message_system_attribute_names(
                    MessageSystemAttributeName::ApproximateFirstReceiveTimestamp,
                )
                .send()
                .await
                .map_err(|e| e.to_string())?;
            if answer.messages().is_empty() {
                break;
            }
            for message in answer.messages() {
                let attribute = |name: &MessageSystemAttributeName| {
                    message
                        .attributes()
                        .and_then(|a| a.get(name))
                        .and_then(|n| n.parse::<u64>().ok())
                        .unwrap_or(0)
                };
                let count = attribute(&MessageSystemAttributeName::ApproximateReceiveCount);
                let first =
                    attribute(&MessageSystemAttributeName::ApproximateFirstReceiveTimestamp);
                counts.push((count, first));
                receipts.extend(message.receipt_handle().map(str::to_owned));
            }
        }
        for receipt in receipts {
            client
                .change_message_visibility()
                .queue_url(&queue_url)
                .receipt_handle(receipt)
                .visibility_timeout(0)
                .send()
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok::<_, String>((invisible, counts))
    })?;
    ensure!(
        invisible == 0,
        "{invisible} message(s) left invisible after the runner stopped ({applied} applied)"
    );
    // Received by the stopping runner (twice in all, with the check's
    // receive): only before the signal, by a receive that started before
    // it (all the orders were waiting, so a receive answers at once).
    let after: Vec<_> = counts
        .iter()
        .filter(|&&(count, first)| count >= 2 && first > signalled + 250)
        .collect();
    ensure!(
        after.is_empty() && counts.iter().all(|&(count, _)| count <= 2),
        "received after SIGTERM ({signalled} ms): {after:?}; all left (count, first receive): {counts:?}"
    );
    ensure!(
        counts.len() as u64 + applied >= N,
        "{} left and {applied} applied of {N}",
        counts.len()
    );
    let rest = finish(spawn_runner_of(&run)?)?.ok_or("the second runner was killed")?;
    check_exact(&run, N)?;
    Ok(format!(
        "SIGTERM with 4 handlers in flight: {applied} applied, none left invisible, the {} left received at most once before ({} given back); a second runner applied {}; state exact",
        counts.len(),
        counts.iter().filter(|&&(c, _)| c == 2).count(),
        rest.applied
    ))
}

/// A poison message (a permanent failure) on a queue without a redrive
/// policy: nowhere to dead-letter it, so the runner keeps it invisible
/// for what is left of SQS's 12 hours since its receive. SQS refuses 12
/// hours more of a message already held: the runner asked for that, and
/// the message came back after every visibility timeout (4 s here), its
/// handler run again, for ever. Over the consumer's 30 s of idleness it is
/// dead-lettered (parked) once, stays in the queue, invisible, and the
/// healthy orders are applied.
fn poison_without_a_redrive_policy_is_parked(url: &str) -> Result<String, String> {
    let run = start::<Sqs>(url)?;
    block_on(async {
        let client = client(url);
        let queue_url = url_of(&client, &run.queue).await?;
        client
            .set_queue_attributes()
            .queue_url(queue_url)
            .attributes(QueueAttributeName::RedrivePolicy, "")
            .send()
            .await
            .map_err(|e| e.to_string())?;
        Ok::<(), String>(())
    })?;
    let mut stream = vec![(format!("{}-poison", run.queue), b"poison".to_vec())];
    stream.extend(orders(&run, 10));
    publish_standard(url, &run.queue, &stream)?;
    let mut child = command::<Sqs>(&run, 4, 0, false)?
        .spawn()
        .map_err(|e| format!("spawn consumer: {e}"))?;
    // It stops after 30 s without a delivery: a poison that keeps coming
    // back (every 4 s) would keep it running.
    let began = std::time::Instant::now();
    while child.try_wait().map_err(|e| e.to_string())?.is_none() {
        if began.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            let _ = child.wait();
            return Err("the consumer never went idle: the poison kept coming back".into());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let counts = finish(child)?.ok_or("the consumer was killed")?;
    check_exact(&run, 10)?;
    let (visible, invisible) = block_on(async {
        let client = client(url);
        let queue_url = url_of(&client, &run.queue).await?;
        let answer = client
            .get_queue_attributes()
            .queue_url(queue_url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let count = |name: &QueueAttributeName| {
            answer
                .attributes()
                .and_then(|a| a.get(name))
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(u64::MAX)
        };
        Ok::<_, String>((
            count(&QueueAttributeName::ApproximateNumberOfMessages),
            count(&QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
        ))
    })?;
    ensure!(
        counts.dead_lettered == 1 && (visible, invisible) == (0, 1),
        "the poison was dead-lettered {} time(s); the queue holds {visible} visible and {invisible} invisible message(s) (expected 1, and 0 and 1)",
        counts.dead_lettered
    );
    Ok("no redrive policy: the poison parked once (invisible for the rest of 12 hours), not run again over 30 s; 10 orders applied; state exact".to_owned())
}

/// A runner on the scenario's queue, 8 in flight.
fn spawn_runner_of(run: &crate::scenarios::Run) -> Result<std::process::Child, String> {
    command::<Sqs>(run, 8, 0, true)?
        .spawn()
        .map_err(|e| format!("spawn consumer: {e}"))
}

fn publish_standard(url: &str, queue: &str, messages: &[(String, Vec<u8>)]) -> Result<(), String> {
    send(url, queue, false, messages)
}

/// A poison message under the runner's default delivery limit (20) on a
/// queue whose redrive policy moves a message after 3 receives: SQS moves
/// it to the dead-letter queue, the runner dead-letters nothing itself,
/// and the 50 healthy orders are applied once, none dead-lettered.
fn redrive(url: &str) -> Result<String, String> {
    let run = start::<Sqs>(url)?;
    block_on(async {
        let client = client(url);
        let queue_url = url_of(&client, &run.queue).await?;
        let dlq_url = url_of(&client, &format!("{}-dlq", run.queue)).await?;
        let arn = client
            .get_queue_attributes()
            .queue_url(&dlq_url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await
            .map_err(|e| e.to_string())?
            .attributes()
            .and_then(|a| a.get(&QueueAttributeName::QueueArn).cloned())
            .ok_or("no ARN")?;
        client
            .set_queue_attributes()
            .queue_url(queue_url)
            .attributes(
                QueueAttributeName::RedrivePolicy,
                format!(r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":"3"}}"#),
            )
            .send()
            .await
            .map_err(|e| e.to_string())?;
        Ok::<(), String>(())
    })?;
    let mut stream = vec![(format!("{}-poison", run.queue), b"poison".to_vec())];
    stream.extend(orders(&run, 50));
    publish_standard(url, &run.queue, &stream)?;
    let mut command = command::<Sqs>(&run, 8, 0, true)?;
    command.env("INBOX_BROKER_RETRY_MS", "50");
    let child = command
        .spawn()
        .map_err(|e| format!("spawn consumer: {e}"))?;
    let counts = finish(child)?.ok_or("the runner was killed")?;
    check_exact(&run, 50)?;
    ensure!(
        counts.dead_lettered == 0 && counts.retried >= 3,
        "the runner retried the poison {} times and dead-lettered {} (expected 3 or more, and none: SQS moves it)",
        counts.retried,
        counts.dead_lettered
    );
    let where_ = one_dead_letter(url, &run.queue, false)?;
    Ok(format!(
        "the poison failed {} times, then SQS's redrive (maxReceiveCount 3) moved it: {where_}; 50 others applied once; state exact",
        counts.retried
    ))
}

/// 300 orders in eight message groups on a FIFO queue. The first 200
/// through one consumer with 8 in flight: SQS hands it several messages of
/// a group at once, and the runner applies them one after another, in
/// order. The last 100 through consumers SIGKILLed between commit and
/// delete at every ninth order, and restarted, each holding one message
/// at a time: moto (5.2) breaks a group's order when a dead consumer held
/// several of its messages (it skips the first ones while the later ones
/// still count as in flight, and hands out the last first), which SQS
/// does not. Each group's orders applied once, in publish order.
fn group_order(url: &str) -> Result<String, String> {
    const N: u64 = 300;
    let run = start::<SqsFifo>(url)?;
    let all = orders(&run, N);
    send(url, &run.queue, true, &all[..200])?;
    let counts =
        finish(spawn_consumer::<SqsFifo>(&run, 8, 0)?)?.ok_or("the consumer was killed")?;
    ensure!(counts.applied == 200, "{counts:?}");
    in_group_order(&run)?;
    send(url, &run.queue, true, &all[200..])?;
    let mut kills = 0;
    loop {
        ensure!(kills <= N / 9, "{kills} kills: the consumer keeps dying");
        let (counts, _, _) = finish_with_output(spawn_consumer::<SqsFifo>(&run, 1, 9)?)?;
        match counts {
            None => kills += 1,
            Some(_) => break,
        }
    }
    check_exact(&run, N)?;
    in_group_order(&run)?;
    Ok(format!(
        "200 orders with 8 in flight, then 100 with {kills} consumers SIGKILLed between commit and delete; every group's orders applied once, in publish order; state exact"
    ))
}

/// Each group's orders were applied in publish order.
fn in_group_order(run: &crate::scenarios::Run) -> Result<(), String> {
    let mut last = std::collections::HashMap::new();
    for seq in applied_in_order(run)? {
        let group = seq % 8;
        let before = last.insert(group, seq).unwrap_or(0);
        ensure!(
            seq > before,
            "group {group}: order {seq} applied after order {before}"
        );
    }
    Ok(())
}

/// The server takes connections and answers nothing for 10 s (the proxy
/// swallows every byte) while the runner (8 in flight) is 30 orders into
/// 100: the requests that hung time out (30 s at most, a receive its long
/// poll more), and the runner finishes within 75 s of the server's return,
/// every order applied once.
fn hung_server(url: &str) -> Result<String, String> {
    const N: u64 = 100;
    let run = start::<Sqs>(url)?;
    publish_standard(url, &run.queue, &orders(&run, N))?;
    let mut command = command::<Sqs>(&run, 8, 0, true)?;
    command
        .env("INBOX_BROKER_IDLE_MS", "90000")
        .env("INBOX_BROKER_EXPECT_APPLIED", N.to_string());
    let child = command
        .spawn()
        .map_err(|e| format!("spawn consumer: {e}"))?;
    wait_for_applied(&run, 30)?;
    let proxy = proxy(url)?;
    let at = applied_so_far(&run);
    proxy.set(Mode::Blackhole);
    std::thread::sleep(Duration::from_secs(10));
    proxy.set(Mode::Forward);
    let back = std::time::Instant::now();
    let counts = finish(child)?.ok_or("the runner was killed")?;
    let took = back.elapsed();
    check_exact(&run, N)?;
    // Bounded: the requests that hung time out (30 s, or the SDK's own
    // limits first) and the runner carries on.
    ensure!(
        took < Duration::from_secs(75),
        "the runner took {took:?} to finish after the server answered again: {counts:?}"
    );
    Ok(format!(
        "SQS hung for 10 s at {} applied: the runner carried on (reconnects {}) and finished {:.1} s after the server answered again; {} applied, {} duplicates; state exact",
        at,
        counts.reconnects,
        took.as_secs_f64(),
        counts.applied,
        counts.duplicates
    ))
}
