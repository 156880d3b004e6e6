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
