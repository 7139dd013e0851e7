//! Receiving a sync message whose changes the replica has already parsed to check them (see
//! `validate`), without Automerge parsing them a second time.
//!
//! Automerge's `receive_sync_message` hands a message's changes to `load_incremental`, which
//! parses each again: decoding every operation of a change and hashing it is most of what the
//! checks cost, so doing it twice made every received change about twice as dear to read.
//! Here the parsed changes go to `apply_changes`, and Automerge receives the message with its
//! change list emptied; the one piece of its sync state that an empty list changes differently
//! is put back. `receive_parsed` leaves the document and the sync state exactly as
//! `receive_sync_message` would (the property `receiving_parsed_changes_is_receiving_the_message`
//! compares the two over random histories).

use std::collections::BTreeSet;

use automerge::sync::{self, SyncDoc};
use automerge::{Automerge, AutomergeError, Change, ChangeHash};

/// Receives `msg` into `doc` and `state` as `receive_sync_message` does, its changes given
/// already parsed: `changes` are all the changes of `msg` that `doc` lacks, in the message's
/// order. A message without changes, a document without any change yet (Automerge loads the
/// first message as a whole document) or a read-only state go to Automerge as they are.
pub(crate) fn receive_parsed(
    doc: &mut Automerge,
    state: &mut sync::State,
    mut msg: sync::Message,
    changes: Vec<Change>,
) -> Result<(), AutomergeError> {
    if msg.changes.is_empty() || state.read_only || doc.get_heads().is_empty() {
        return doc.receive_sync_message(state, msg);
    }
    let before = doc.get_heads();
    doc.apply_changes(changes)?;
    // What Automerge does after loading a message's changes: the heads both peers now share
    // are the document's new heads and the shared ones still heads.
    let after = doc.get_heads();
    let old: BTreeSet<&ChangeHash> = before.iter().collect();
    let mut shared: BTreeSet<ChangeHash> =
        after.iter().filter(|h| !old.contains(h)).copied().collect();
    shared.extend(
        state
            .shared_heads
            .iter()
            .filter(|h| after.contains(h))
            .copied(),
    );
    state.shared_heads = shared.into_iter().collect();
    // With its changes, a message never sets the heads last sent to its own; without them it
    // does when they equal the document's (now, after loading) heads. An empty list of heads
    // resets them in both cases.
    let last_sent = (!msg.heads.is_empty()).then(|| state.last_sent_heads.clone());
    msg.changes = Vec::<Vec<u8>>::new().into();
    doc.receive_sync_message(state, msg)?;
    if let Some(last_sent) = last_sent {
        state.last_sent_heads = last_sent;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use automerge::ReadDoc;
    use automerge::transaction::Transactable;
    use proptest::prelude::*;

    /// A step of three documents syncing pairwise: a local write, a message generated (kept on
    /// the wire), one delivered from the wire (in any order, so some wait for dependencies), one
    /// dropped, or a pair's sessions reset (a reconnection).
    #[derive(Debug, Clone)]
    enum Step {
        Write(usize, u8),
        Send(usize, usize),
        Deliver(usize),
        Drop(usize),
        Reset(usize, usize),
    }

    fn step() -> impl Strategy<Value = Step> {
        let i = 0..3usize;
        prop_oneof![
            3 => (i.clone(), any::<u8>()).prop_map(|(i, v)| Step::Write(i, v)),
            4 => (i.clone(), i.clone()).prop_map(|(a, b)| Step::Send(a, b)),
            5 => (0..8usize).prop_map(Step::Deliver),
            1 => (0..8usize).prop_map(Step::Drop),
            1 => (i.clone(), i).prop_map(|(a, b)| Step::Reset(a, b)),
        ]
    }

    fn encoded(doc: &Automerge, state: &sync::State) -> Option<Vec<u8>> {
        doc.generate_sync_message(&mut state.clone())
            .map(sync::Message::encode)
    }

    proptest! {
        #![proptest_config(piecework_proptest_config::config(1000))]

        /// Every message a document receives, received both ways on copies: the same heads,
        /// the same changes waiting for their dependencies, the same sync state and the same
        /// next message.
        #[test]
        fn receiving_parsed_changes_is_receiving_the_message(
            steps in proptest::collection::vec(step(), 0..150)
        ) {
            let mut docs: Vec<Automerge> = (0..3u8)
                .map(|i| Automerge::new().with_actor(automerge::ActorId::from(vec![i + 1; 16])))
                .collect();
            let mut states: Vec<Vec<sync::State>> =
                (0..3).map(|_| (0..3).map(|_| sync::State::new()).collect()).collect();
            let mut wire: Vec<(usize, usize, Vec<u8>)> = Vec::new();
            for s in steps {
                match s {
                    Step::Write(i, v) => {
                        let mut tx = docs[i].transaction();
                        tx.put(automerge::ROOT, format!("k{}", v % 7), i64::from(v)).unwrap();
                        tx.commit();
                    }
                    Step::Send(a, b) if a != b => {
                        if let Some(m) = docs[a].generate_sync_message(&mut states[a][b]) {
                            wire.push((a, b, m.encode()));
                        }
                    }
                    Step::Deliver(k) if k < wire.len() => {
                        let (a, b, bytes) = wire.remove(k);
                        let msg = sync::Message::decode(&bytes).unwrap();
                        let checked = crate::validate::check_changes(&docs[b], msg.changes.iter(), &[]);
                        let parsed = checked.ok().and_then(|c| c.parsed);
                        let mut doc = docs[b].clone();
                        let mut state = states[b][a].clone();
                        let theirs = doc.receive_sync_message(&mut state, msg.clone());
                        if let Some(changes) = parsed {
                            let mut ours_doc = docs[b].clone();
                            let mut ours_state = states[b][a].clone();
                            let ours = receive_parsed(&mut ours_doc, &mut ours_state, msg, changes);
                            prop_assert_eq!(theirs.is_ok(), ours.is_ok());
                            prop_assert_eq!(doc.get_heads(), ours_doc.get_heads());
                            prop_assert_eq!(doc.get_missing_deps(&[]), ours_doc.get_missing_deps(&[]));
                            prop_assert_eq!(&state, &ours_state);
                            prop_assert_eq!(encoded(&doc, &state), encoded(&ours_doc, &ours_state));
                            prop_assert_eq!(doc.get(automerge::ROOT, "k1").unwrap().map(|(v, _)| v.to_string()),
                                ours_doc.get(automerge::ROOT, "k1").unwrap().map(|(v, _)| v.to_string()));
                        }
                        if theirs.is_ok() {
                            docs[b] = doc;
                            states[b][a] = state;
                        }
                    }
                    Step::Drop(k) if k < wire.len() => {
                        wire.remove(k);
                    }
                    Step::Reset(a, b) if a != b => {
                        states[a][b] = sync::State::new();
                        states[b][a] = sync::State::new();
                    }
                    _ => {}
                }
            }
        }
    }
}
