//! Values a faulty or hostile member can write into a queue document, and what reading them
//! costs: each test here failed (spun, panicked or followed the forgery) before its fix.

use piecework_queue_doc::epoch::{self, Link};
use piecework_queue_doc::{Claim, PeerId};
use proptest::prelude::*;

fn link(epoch: u64, term: u64, peer: &str, doc: &str) -> Link {
    Link {
        epoch,
        claim: Claim::new(term, PeerId::new(peer)),
        doc: doc.into(),
    }
}

/// The order lineages had before it was counted: every epoch number from the least to the
/// greatest either names, looked up by a scan. Right, but its work is the range of the epoch
/// numbers, which a peer chooses.
fn by_every_epoch(a: &[Link], b: &[Link]) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    let at = |l: &[Link], e: u64| l.iter().find(|x| x.epoch == e).cloned();
    let lo = a.iter().chain(b).map(|l| l.epoch).min().unwrap_or(0);
    let hi = a.iter().chain(b).map(|l| l.epoch).max().unwrap_or(0);
    for e in lo..=hi {
        match (at(a, e), at(b, e)) {
            (Some(x), Some(y)) if x != y => return (&x.claim, &x.doc).cmp(&(&y.claim, &y.doc)),
            (Some(_), None) if b.iter().all(|l| l.epoch < e) => return Ordering::Greater,
            (None, Some(_)) if a.iter().all(|l| l.epoch < e) => return Ordering::Less,
            _ => {}
        }
    }
    Ordering::Equal
}

#[test]
fn a_forged_lineage_at_u64_max_is_compared_in_work_bounded_by_its_length() {
    let honest = vec![link(1, 1, "a", "d1"), link(2, 2, "a", "d2")];
    let forged = vec![link(1, 1, "a", "d1"), link(u64::MAX, 9, "x", "forged")];
    let (order, looked) = epoch::cmp_lineage_counted(&forged, &honest);
    assert_eq!(
        order,
        std::cmp::Ordering::Greater,
        "the order itself is unchanged: the forgery descends further"
    );
    assert!(
        looked <= forged.len() + honest.len(),
        "looked at {looked} epochs for lineages of {} and {} links",
        forged.len(),
        honest.len()
    );
    let (_, looked) = epoch::cmp_lineage_counted(&[link(0, 1, "a", "z")], &forged);
    assert!(looked <= 3, "looked at {looked} epochs");
}

fn lineage() -> impl Strategy<Value = Vec<Link>> {
    prop::collection::vec(
        (0u64..12, 0u64..3, 0u8..2, 0u8..3).prop_map(|(e, t, p, d)| {
            link(e, t, ["a", "b"][p as usize], ["d", "e", "f"][d as usize])
        }),
        0..8,
    )
}

proptest! {
    #![proptest_config(piecework_proptest_config::config(512))]

    /// Counting the comparison changed no order: on lineages whose epoch range is small, it
    /// agrees with the comparison that visits every epoch, and it looks at most at one epoch
    /// per link.
    #[test]
    fn the_counted_order_is_the_order_of_every_epoch(a in lineage(), b in lineage()) {
        let (order, looked) = epoch::cmp_lineage_counted(&a, &b);
        prop_assert_eq!(order, by_every_epoch(&a, &b));
        prop_assert!(looked <= a.len() + b.len());
    }
}
