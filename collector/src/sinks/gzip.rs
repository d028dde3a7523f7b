//! gzip for what Junction sends: OTLP requests and `/metrics` pages.

use bytes::Bytes;

/// gzip at level 2 (zlib-rs), one compressor for every export or scrape. The 8-GPU node's 305 KB
/// request: 18.8 KB (9 bytes a point), the 64-GPU node's 2.4 MB: 111 KB (6.7); level 1
/// 21.3 KB for a quarter less CPU, level 6 17.0 KB for three times it. Against flate2's
/// default backend (miniz_oxide) at level 2, zlib-rs took a third of the CPU on the 64-GPU
/// request (1.7 against 4.6 ms). Reset, not rebuilt, per export: its tables (with
/// miniz_oxide 280 KB in five blocks, heaptrack) are allocated once, so the exports no
/// longer carve and free them from the allocator's arenas every second.
///
/// A request is fed to it in pieces as the encoder writes them (`start`, `feed`..., `finish`).
pub struct Gzip {
    z: flate2::Compress,
    /// The body being compressed; between exports, the last body's buffer, back from the
    /// client when it let go of it.
    out: Vec<u8>,
    /// The first error of this body's `feed`s, which `finish` returns.
    failed: Option<flate2::CompressError>,
}

impl Default for Gzip {
    fn default() -> Self {
        Self::new()
    }
}

impl Gzip {
    /// A compressor at [`crate::sinks::GZIP_LEVEL`].
    pub fn new() -> Self {
        Self {
            z: flate2::Compress::new_gzip(flate2::Compression::new(crate::sinks::GZIP_LEVEL), 15),
            out: Vec::new(),
            failed: None,
        }
    }

    /// Begins a body.
    pub fn start(&mut self) {
        self.z.reset();
        self.out.clear();
        self.failed = None;
    }

    /// Compresses the next piece of the body.
    pub fn feed(&mut self, piece: &[u8]) {
        if self.failed.is_some() {
            return;
        }
        let first = self.z.total_in();
        loop {
            let read = usize::try_from(self.z.total_in() - first).unwrap_or(piece.len());
            if read >= piece.len() {
                return;
            }
            // Requests shrink 15 to 25 times; the buffer grows when it is nearly full.
            if self.out.capacity() - self.out.len() < 1024 {
                self.out
                    .reserve((piece.len() / 8).max(self.out.capacity() / 2).max(4096));
            }
            let (was_in, was_out) = (self.z.total_in(), self.z.total_out());
            if let Err(e) =
                self.z
                    .compress_vec(&piece[read..], &mut self.out, flate2::FlushCompress::None)
            {
                self.failed = Some(e);
                return;
            }
            if (self.z.total_in(), self.z.total_out()) == (was_in, was_out) {
                // No room to go on: more.
                self.out.reserve(self.out.capacity().max(4096));
            }
        }
    }

    /// The body gzipped (header, deflate stream, CRC and length).
    pub fn finish(&mut self) -> Result<Bytes, flate2::CompressError> {
        self.finish_vec().map(Bytes::from)
    }

    /// [`Gzip::finish`] as the buffer itself (the compressor starts the next body in a new
    /// one unless it is given one back, [`Gzip::keep_buffer`]).
    pub fn finish_vec(&mut self) -> Result<Vec<u8>, flate2::CompressError> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        loop {
            let status = self
                .z
                .compress_vec(&[], &mut self.out, flate2::FlushCompress::Finish)?;
            if status == flate2::Status::StreamEnd {
                return Ok(std::mem::take(&mut self.out));
            }
            self.out.reserve(self.out.capacity().max(4096));
        }
    }

    /// `body` gzipped whole.
    #[cfg(test)]
    fn compress(&mut self, body: &[u8]) -> Result<Bytes, flate2::CompressError> {
        self.start();
        self.feed(body);
        self.finish()
    }

    /// Takes the sent body's buffer back for the next export (without a copy when the
    /// client holds no other handle to it).
    pub fn keep(&mut self, sent: Bytes) {
        self.keep_buffer(Vec::from(sent));
    }

    /// Takes `buf` (emptied) for the next body's output, unless the compressor holds a
    /// larger one.
    pub fn keep_buffer(&mut self, mut buf: Vec<u8>) {
        if buf.capacity() > self.out.capacity() {
            buf.clear();
            self.out = buf;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Gzip;
    use std::io::Read as _;

    fn gunzip(b: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(b)
            .read_to_end(&mut out)
            .expect("a whole gzip member");
        out
    }

    #[test]
    fn one_compressor_gzips_every_export_whole() {
        let mut z = Gzip::new();
        // A body larger than the first guess of the output (an eighth of it) and then one
        // that does not compress at all: the buffer grows; then a small one after both.
        let big: Vec<u8> = (0..600_000u32).map(|i| (i % 251) as u8).collect();
        let mut noise = vec![0u8; 70_000];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for b in &mut noise {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        for body in [&big[..], &noise[..], b"small", b""] {
            let sent = z.compress(body).expect("gzip");
            assert_eq!(&sent[..2], &[0x1f, 0x8b], "a gzip header");
            assert_eq!(gunzip(&sent), body, "the same bytes back");
            let at = sent.as_ptr();
            z.keep(sent);
            // The buffer comes back without a copy when nothing else holds it.
            assert_eq!(z.out.as_ptr(), at);
        }
    }

    #[test]
    fn a_body_fed_in_pieces_is_the_same_gzip_member_as_one_fed_whole() {
        let mut z = Gzip::new();
        let body: Vec<u8> = (0..300_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 27) as u8)
            .collect();
        for piece in [1usize, 7, 4096, 65_536, body.len()] {
            z.start();
            for p in body.chunks(piece) {
                z.feed(p);
            }
            z.feed(&[]);
            let sent = z.finish().expect("gzip");
            assert_eq!(gunzip(&sent), body, "pieces of {piece} bytes");
            z.keep(sent);
        }
        // An empty body is a whole (empty) member too.
        z.start();
        assert_eq!(gunzip(&z.finish().expect("gzip")), b"");
    }
}
