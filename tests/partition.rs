//! A network partition between `piecework node` processes, and its heal.
//!
//! Four node processes run in network namespaces of their own ([`support::netns::Lab`]), two
//! on each side of a link that the test cuts and restores (`ip link set … down/up` on a veth
//! pair between two bridges, in a hub namespace). libp2p traffic stays inside the lab's
//! namespaces; the test reaches each node's HTTP API over a control link of its own, which the
//! partition does not touch. The queue has short timings ([`support::fast_config`]: takeover
//! after 1 s without the router's heartbeat).
//!
//! What is checked:
//!
//! 1. Before the cut, the four nodes agree on one router and run tasks submitted on any node.
//! 2. After the cut, each side has a router of its own: every node of a side names a node of
//!    that side as the effective router, and that node's role is `active`.
//! 3. Tasks submitted on either side during the partition succeed there, run by a worker of
//!    that side.
//! 4. After the heal, exactly one router remains: every node's status names the same effective
//!    router, whose claim is at least each side's, that node's role is `active` and every other
//!    node's is `follower`.
//! 5. Every task submitted on either side (before, during and after the partition) is
//!    `succeeded` with its result, as seen by every node.
//!
//! It needs root (to make network namespaces). Where `ip netns` is not allowed, it prints why
//! and passes without running (CI runs as root).
//!
//! Waits are on process output and on the API's long-poll; router roles, which have no event
//! in the API, are polled with a short pause under a generous deadline.

mod support;

use std::time::Instant;

use piecework::node::api;
use piecework::queue_doc::{AttemptOutcome, Claim, QueueId, TaskId, TaskState};
use support::netns::Lab;
use support::{NodeOptions, NodeProcess, fast_config, poll, spawn, submit_sleep, wait_final};

/// The queue's status on each of `nodes` (by index into `all`), or why not.
async fn queue_statuses(
    all: &[NodeProcess],
    nodes: &[usize],
    queue: &QueueId,
) -> Result<Vec<(usize, api::QueueStatus)>, String> {
    let mut out = vec![];
    for &i in nodes {
        let status = all[i]
            .client()
            .status()
            .await
            .map_err(|e| format!("node {i}: {e:#}"))?;
        let q = status
            .queues
            .into_iter()
            .find(|q| q.id == *queue)
            .ok_or_else(|| format!("node {i} does not list the queue"))?;
        out.push((i, q));
    }
    Ok(out)
}

/// Ok with the router and its node when every node in `group` names the same effective router,
/// that router is a node of `group` whose role is `active`, and every other node of the group
/// is a `follower`.
async fn one_router(
    all: &[NodeProcess],
    group: &[usize],
    queue: &QueueId,
) -> Result<(usize, Claim), String> {
    let statuses = queue_statuses(all, group, queue).await?;
    let summary = || {
        statuses
            .iter()
            .map(|(i, q)| {
                let r = q
                    .router
                    .as_ref()
                    .map_or("-".into(), |r| format!("{} term {}", r.peer, r.term));
                format!("node {i}: {} (router {r})", q.role)
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    let router = statuses[0].1.router.clone().ok_or_else(summary)?;
    let owner = group
        .iter()
        .copied()
        .find(|&i| all[i].peer == router.peer.as_str())
        .ok_or_else(summary)?;
    for (i, q) in &statuses {
        let role = if *i == owner { "active" } else { "follower" };
        if q.router.as_ref() != Some(&router) || q.role != role {
            return Err(summary());
        }
    }
    Ok((owner, router))
}

/// Checks that `id` succeeded on a worker of `side`, waiting through node `via`.
async fn succeeded_on(
    all: &[NodeProcess],
    urls: &[String],
    via: usize,
    side: &[usize],
    id: &TaskId,
) {
    let s = wait_final(urls, &all[via].http, id).await;
    assert_eq!(s.state, TaskState::Succeeded, "{id}: {s:#?}");
    let a = s
        .attempts
        .iter()
        .find(|a| {
            a.finished
                .as_ref()
                .is_some_and(|f| f.outcome == AttemptOutcome::Succeeded)
        })
        .expect("a succeeded attempt");
    assert!(
        side.iter().any(|&i| all[i].peer == a.worker.peer.as_str()),
        "{id} ran on {}, not on a node of side {side:?}: {s:#?}",
        a.worker
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_between_node_processes_heals_into_one_router() {
    if let Err(why) = Lab::available() {
        eprintln!(
            "SKIPPED a_partition_between_node_processes_heals_into_one_router: this machine does \
             not let the test make network namespaces ({why}); run it as root on Linux"
        );
        return;
    }
    let t0 = Instant::now();
    // Declared before the nodes, so that it is dropped (and the namespaces deleted) after they
    // are killed.
    let lab = Lab::new(&[2, 2]).expect("the lab's namespaces");
    let dir = tempfile::tempdir().unwrap();
    let mut nodes: Vec<NodeProcess> = vec![];
    for (k, slot) in lab.slots.iter().enumerate() {
        let opts = NodeOptions {
            data_dir: dir.path().join(format!("n{k}")),
            listen: format!("/ip4/{}/tcp/0", slot.data_ip),
            http: format!("{}:0", slot.ctl_ip),
            bootstrap: nodes.iter().map(|n| n.listen.clone()).collect(),
            workers: 2,
            netns: Some(slot.ns.clone()),
            extra: vec![],
        };
        nodes.push(tokio::task::block_in_place(|| spawn(&opts)));
    }
    let urls: Vec<String> = nodes.iter().map(|n| n.http.clone()).collect();
    let everyone: Vec<usize> = (0..nodes.len()).collect();
    let sides: Vec<Vec<usize>> = (0..2)
        .map(|s| {
            everyone
                .iter()
                .copied()
                .filter(|&k| lab.slots[k].side == s)
                .collect()
        })
        .collect();

    let queue = nodes[0]
        .client()
        .create_queue("partition", Some(fast_config()))
        .await
        .unwrap();
    let admin = nodes[0].client();
    for n in &nodes[1..] {
        n.client()
            .join_from(&admin, &queue, &n.peer, piecework::queue_doc::Role::Admin)
            .await
            .unwrap();
    }

    // 1. One cluster: tasks submitted anywhere run.
    let mut tasks: Vec<TaskId> = vec![];
    for n in &nodes {
        tasks.push(submit_sleep(n, &queue, 100).await);
    }
    for id in &tasks {
        wait_final(&urls, &urls[0], id).await;
    }
    let (before, _) = poll("one router before the cut", || {
        one_router(&nodes, &everyone, &queue)
    })
    .await;
    eprintln!("[{:?}] router before the cut: node {before}", t0.elapsed());

    // 2. Cut: each side ends up with a router of its own.
    lab.cut(0);
    let mut side_claims = vec![];
    for side in &sides {
        let (owner, claim) = poll("a router on each side of the partition", || {
            one_router(&nodes, side, &queue)
        })
        .await;
        eprintln!(
            "[{:?}] side {side:?}: node {owner} routes, term {}",
            t0.elapsed(),
            claim.term
        );
        side_claims.push(claim);
    }
    assert_ne!(side_claims[0], side_claims[1], "two routers");

    // 3. Each side runs what is submitted on it.
    let mut during: Vec<(usize, TaskId)> = vec![];
    for (s, side) in sides.iter().enumerate() {
        for &k in side {
            for _ in 0..2 {
                during.push((s, submit_sleep(&nodes[k], &queue, 300).await));
            }
        }
    }
    for (s, id) in &during {
        succeeded_on(&nodes, &urls, sides[*s][0], &sides[*s], id).await;
    }
    eprintln!(
        "[{:?}] {} tasks ran during the partition",
        t0.elapsed(),
        during.len()
    );
    // Both sides still have their own router (neither heard the other meanwhile).
    for (side, claim) in sides.iter().zip(&side_claims) {
        let (_, now) = poll("each side to keep its router", || {
            one_router(&nodes, side, &queue)
        })
        .await;
        assert!(now >= *claim, "{now:?} < {claim:?}");
    }
    tasks.extend(during.into_iter().map(|(_, id)| id));

    // 4. Heal: one router remains.
    lab.heal(0);
    let (after, claim) = poll("one router after the heal", || {
        one_router(&nodes, &everyone, &queue)
    })
    .await;
    eprintln!(
        "[{:?}] healed: node {after} routes, term {}",
        t0.elapsed(),
        claim.term
    );
    for c in &side_claims {
        assert!(claim >= *c, "the surviving router {claim:?} is below {c:?}");
    }

    // 5. The merged cluster runs new tasks, and every task is done, seen from every node.
    for n in &nodes {
        tasks.push(submit_sleep(n, &queue, 100).await);
    }
    for id in &tasks {
        for url in &urls {
            let s = wait_final(&urls, url, id).await;
            assert_eq!(s.state, TaskState::Succeeded, "{id} via {url}: {s:#?}");
            assert!(s.result.is_some(), "{id} via {url} has its result");
        }
    }
    for (i, q) in queue_statuses(&nodes, &everyone, &queue).await.unwrap() {
        assert!(
            q.tasks.succeeded == tasks.len(),
            "node {i} counts {} succeeded of {}: {q:#?}",
            q.tasks.succeeded,
            tasks.len()
        );
    }
    let (last, _) = poll("still one router", || one_router(&nodes, &everyone, &queue)).await;
    eprintln!(
        "[{:?}] all {} tasks succeeded; node {last} routes",
        t0.elapsed(),
        tasks.len()
    );
}
