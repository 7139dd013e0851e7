//! The wire messages between replicas.

use crate::DocId;

/// A message between replicas about one document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// An Automerge sync message.
    Sync {
        /// The document.
        doc: DocId,
        /// The encoded sync message.
        data: Vec<u8>,
    },
    /// "Send me this document if you have it."
    Request {
        /// The document.
        doc: DocId,
    },
    /// "I do not have this document."
    Unavailable {
        /// The document.
        doc: DocId,
    },
    /// "Send me this document: here is why I may have it" (an invite). Answered like a
    /// [`Message::Request`] if the receiving driver accepts the proof
    /// ([`crate::Event::Presented`]), [`Message::Unavailable`] otherwise.
    Present {
        /// The document.
        doc: DocId,
        /// The proof, opaque to the replica (at most [`MAX_PROOF_BYTES`]).
        proof: Vec<u8>,
    },
}

/// The largest proof a [`Message::Present`] may carry.
pub const MAX_PROOF_BYTES: usize = 16 * 1024;

/// A message from the network could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The message is shorter than its header says.
    #[error("truncated replica message")]
    Truncated,
    /// Unknown message type.
    #[error("unknown replica message type {0}")]
    UnknownType(u8),
    /// The document id is malformed.
    #[error("malformed document id in a replica message")]
    BadDocId,
}

impl Message {
    /// The document the message is about.
    pub fn doc(&self) -> &DocId {
        match self {
            Message::Sync { doc, .. }
            | Message::Request { doc }
            | Message::Unavailable { doc }
            | Message::Present { doc, .. } => doc,
        }
    }

    /// Encodes the message: type byte, id length byte, id, then the sync data.
    pub fn encode(&self) -> Vec<u8> {
        let (ty, doc, data): (u8, &DocId, &[u8]) = match self {
            Message::Sync { doc, data } => (1, doc, data),
            Message::Request { doc } => (2, doc, &[]),
            Message::Unavailable { doc } => (3, doc, &[]),
            Message::Present { doc, proof } => (4, doc, proof),
        };
        let id = doc.as_str().as_bytes();
        let mut out = Vec::with_capacity(2 + id.len() + data.len());
        out.push(ty);
        out.push(u8::try_from(id.len()).expect("document ids are short"));
        out.extend_from_slice(id);
        out.extend_from_slice(data);
        out
    }

    /// The type byte, the document and the sync data of an encoded message, without copying
    /// the data.
    fn split(bytes: &[u8]) -> Result<(u8, DocId, &[u8]), DecodeError> {
        let [ty, len, rest @ ..] = bytes else {
            return Err(DecodeError::Truncated);
        };
        let len = usize::from(*len);
        if rest.len() < len {
            return Err(DecodeError::Truncated);
        }
        let (id, data) = rest.split_at(len);
        let doc = std::str::from_utf8(id)
            .ok()
            .and_then(DocId::parse)
            .ok_or(DecodeError::BadDocId)?;
        Ok((*ty, doc, data))
    }

    /// The document an encoded message is about, read from its header alone (for logs).
    pub fn peek_doc(bytes: &[u8]) -> Option<DocId> {
        Message::split(bytes).ok().map(|(_, doc, _)| doc)
    }

    /// Decodes a message from the network.
    pub fn decode(bytes: &[u8]) -> Result<Message, DecodeError> {
        let (ty, doc, data) = Message::split(bytes)?;
        Ok(match ty {
            1 => Message::Sync {
                doc,
                data: data.to_vec(),
            },
            2 => Message::Request { doc },
            3 => Message::Unavailable { doc },
            4 if data.len() <= MAX_PROOF_BYTES => Message::Present {
                doc,
                proof: data.to_vec(),
            },
            t => return Err(DecodeError::UnknownType(t)),
        })
    }
}
