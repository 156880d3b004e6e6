//! A tonic codec that carries serde types as JSON.
//!
//! The RPC messages are the same Rust types the state store and the HTTP API
//! use, so a serde codec avoids keeping a protobuf copy of every type.

use std::marker::PhantomData;

use bytes::{Buf, BufMut};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

/// Largest RPC message accepted, in bytes. Plans and alloc lists for big jobs
/// exceed tonic's 4 MiB default.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024 * 1024;

/// JSON codec for the request type `T` and response type `U`.
#[derive(Debug)]
pub struct JsonCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for JsonCodec<T, U> {
    fn default() -> Self {
        JsonCodec(PhantomData)
    }
}

/// Encodes `T` as JSON.
#[derive(Debug)]
pub struct JsonEncoder<T>(PhantomData<T>);

/// Decodes `U` from JSON.
#[derive(Debug)]
pub struct JsonDecoder<U>(PhantomData<U>);

impl<T: Serialize> Encoder for JsonEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: Self::Item, buf: &mut EncodeBuf<'_>) -> Result<(), Self::Error> {
        serde_json::to_writer(buf.writer(), &item).map_err(|e| Status::internal(format!("encoding rpc message: {e}")))
    }
}

impl<U: DeserializeOwned> Decoder for JsonDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Self::Error> {
        if !buf.has_remaining() {
            return Ok(None);
        }
        serde_json::from_reader(buf.reader()).map(Some).map_err(|e| Status::invalid_argument(format!("decoding rpc message: {e}")))
    }
}

/// How deeply a message may nest when it is decoded.
///
/// What a node sends is stored by the servers wrapped in more levels (a Raft log entry, a
/// snapshot, the reply that carries it back), each decoded again with serde_json's limit of
/// 128. So requests from nodes are held to [`crate::lenient::MAX_REQUEST_DEPTH`], as HTTP
/// request bodies are, and replies (which nest deeper than what they were built from) only
/// to serde_json's own limit.
pub trait DecodeLimit {
    /// Deepest nesting accepted before parsing; `None` leaves serde_json's limit of 128.
    const MAX_DEPTH: Option<usize> = None;
}

/// Decodes one node RPC message, refusing it before parsing when it nests deeper than its
/// type allows. Public so the fuzz targets decode exactly as the servers do.
pub fn decode_message<U: DeserializeOwned + DecodeLimit>(bytes: &[u8]) -> Result<U, Status> {
    if let Some(max) = U::MAX_DEPTH {
        crate::lenient::check_depth(bytes, max).map_err(|e| Status::invalid_argument(format!("decoding rpc message: {e}")))?;
    }
    serde_json::from_slice(bytes).map_err(|e| Status::invalid_argument(format!("decoding rpc message: {e}")))
}

/// JSON codec for the client-server (node) services: like [`JsonCodec`], with each message
/// type's [`DecodeLimit`] applied.
#[derive(Debug)]
pub struct NodeRpcCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for NodeRpcCodec<T, U> {
    fn default() -> Self {
        NodeRpcCodec(PhantomData)
    }
}

/// Decodes `U` from JSON within its [`DecodeLimit`].
#[derive(Debug)]
pub struct LimitedJsonDecoder<U>(PhantomData<U>);

impl<U: DeserializeOwned + DecodeLimit> Decoder for LimitedJsonDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Self::Error> {
        if !buf.has_remaining() {
            return Ok(None);
        }
        // One contiguous buffer (tonic hands over one message at a time), for the depth scan.
        let bytes = buf.copy_to_bytes(buf.remaining());
        decode_message(&bytes).map(Some)
    }
}

impl<T, U> Codec for NodeRpcCodec<T, U>
where
    T: Serialize + Send + 'static,
    U: DeserializeOwned + DecodeLimit + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = JsonEncoder<T>;
    type Decoder = LimitedJsonDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        JsonEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        LimitedJsonDecoder(PhantomData)
    }
}

impl<T, U> Codec for JsonCodec<T, U>
where
    T: Serialize + Send + 'static,
    U: DeserializeOwned + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = JsonEncoder<T>;
    type Decoder = JsonDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        JsonEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        JsonDecoder(PhantomData)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::{AllocsGetResponse, NodeRegisterRequest};

    fn register_with_plugins(depth: usize) -> String {
        format!(r#"{{"Node":{{"ID":"n","HostNetworks":{{"p":{}1{}}}}}}}"#, "[".repeat(depth), "]".repeat(depth))
    }

    #[test]
    fn node_requests_nested_past_the_limit_are_refused_before_parsing() {
        // 3 levels of request, then the plugin value.
        assert!(decode_message::<NodeRegisterRequest>(register_with_plugins(61).as_bytes()).is_ok());
        for depth in [62, 120, 100_000] {
            let e = decode_message::<NodeRegisterRequest>(register_with_plugins(depth).as_bytes()).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(e.message().contains("nest deeper than 64 levels"), "{depth}: {}", e.message());
        }
    }

    #[test]
    fn replies_keep_serde_jsons_limit() {
        let reply = |depth: usize| format!(r#"{{"Allocs":[{{"ID":"a","DeploymentStatus":{}1{}}}]}}"#, "[".repeat(depth), "]".repeat(depth));
        assert!(decode_message::<AllocsGetResponse>(reply(100).as_bytes()).is_ok());
        let e = decode_message::<AllocsGetResponse>(reply(100_000).as_bytes()).unwrap_err();
        assert!(e.message().contains("recursion limit"), "{}", e.message());
    }
}
