//! Kernel struct offsets from BTF (`/sys/kernel/btf/vmlinux`).
//!
//! Rust BPF programs get no CO-RE relocations, so the offsets of the fields the programs walk
//! (`task_struct.files`, `files_struct.fdt`, `fdtable.{max_fds,fd}`, `file.f_inode`,
//! `inode.i_rdev`, `task_struct.{group_leader,comm}`) are read from the running kernel's BTF
//! at start-up and passed in as a global. Only what that needs is read, and the blob is not
//! held: the string section is scanned once for the names asked for, the type records once
//! for where each starts (each kind's trailing data is skipped by its documented size,
//! `Documentation/bpf/btf.rst`), and the few records a lookup needs are then read where they
//! are. Anonymous struct and union members are searched through. vmlinux's BTF is about 5 MB
//! and 130,000 types; this holds a table of 4 bytes a type and a 64 KiB buffer.

use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};

use junction_common::Offsets;

/// Why offsets could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    /// The file is not BTF or is cut short.
    #[error("not a BTF blob: {0}")]
    Format(&'static str),
    /// A type kind this parser does not know (a newer kernel): its size is unknown.
    #[error("unknown BTF kind {0}")]
    UnknownKind(u32),
    /// A struct or field is not there.
    #[error("{0} not found in the kernel's BTF")]
    Missing(String),
    /// The file could not be read.
    #[error("reading it: {0}")]
    Read(#[source] std::io::Error),
}

const KIND_INT: u32 = 1;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

/// The fields the programs need, in [`Offsets`]' order.
const FIELDS: [(&str, &str); 8] = [
    ("task_struct", "files"),
    ("files_struct", "fdt"),
    ("fdtable", "max_fds"),
    ("fdtable", "fd"),
    ("file", "f_inode"),
    ("inode", "i_rdev"),
    ("task_struct", "group_leader"),
    ("task_struct", "comm"),
];

/// The offsets the programs need, from a BTF blob.
pub fn offsets(blob: impl Read + Seek) -> Result<Offsets, BtfError> {
    let [
        task_files,
        files_fdt,
        fdt_max_fds,
        fdt_fd,
        file_inode,
        inode_rdev,
        task_group_leader,
        task_comm,
    ] = field_offsets(blob, &FIELDS)?;
    Ok(Offsets {
        task_files,
        files_fdt,
        fdt_max_fds,
        fdt_fd,
        file_inode,
        inode_rdev,
        task_group_leader,
        task_comm,
        exit_group_dead: 0,
        valid: 1,
    })
}

/// The byte offset of each `(struct, field)` of `wanted` in a little-endian BTF blob.
pub fn field_offsets<const N: usize>(
    blob: impl Read + Seek,
    wanted: &[(&str, &str); N],
) -> Result<[u32; N], BtfError> {
    let mut btf = Btf::open(blob, wanted)?;
    let mut out = [0; N];
    for (slot, (strukt, field)) in out.iter_mut().zip(wanted) {
        *slot = btf.offset(strukt, field)?;
    }
    Ok(out)
}

/// A type record's leading words.
struct Type {
    name: u32,
    kind: u32,
    /// Member count (struct, union).
    vlen: u32,
    kind_flag: bool,
    /// The referenced type (typedef, modifiers).
    ty: u32,
}

/// The blob's layout, with what was found of the names asked for.
struct Btf<'w, R> {
    r: BufReader<R>,
    /// Where the type section starts in the blob.
    types: u64,
    /// Index = type id - 1 (0 is `void`): the record's offset in the type section.
    at: Vec<u32>,
    /// The names asked for (structs and fields), each with its offsets in the string section
    /// (BTF's strings are deduplicated; a blob that repeats one is still read right).
    names: Vec<(&'w str, Vec<u32>)>,
    /// Each struct asked for: its first complete definition (a forward declaration has kind
    /// FWD).
    structs: Vec<(&'w str, u32)>,
}

fn word(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i * 4], b[i * 4 + 1], b[i * 4 + 2], b[i * 4 + 3]])
}

fn cut_short(e: std::io::Error) -> BtfError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        BtfError::Format("truncated")
    } else {
        BtfError::Read(e)
    }
}

impl<'w, R: Read + Seek> Btf<'w, R> {
    /// Reads the header, finds the names of `wanted` in the string section and where every
    /// type record starts.
    fn open(blob: R, wanted: &[(&'w str, &'w str)]) -> Result<Self, BtfError> {
        let mut r = BufReader::with_capacity(64 * 1024, blob);
        let mut hdr = [0u8; 24];
        r.read_exact(&mut hdr).map_err(cut_short)?;
        if hdr[0..2] != [0x9F, 0xEB] {
            return Err(BtfError::Format("bad magic (big-endian or not BTF)"));
        }
        let hdr_len = u64::from(word(&hdr, 1));
        let (type_off, type_len) = (u64::from(word(&hdr, 2)), u64::from(word(&hdr, 3)));
        let (str_off, str_len) = (u64::from(word(&hdr, 4)), u64::from(word(&hdr, 5)));
        if hdr_len < 24 {
            return Err(BtfError::Format("header too short"));
        }
        let mut names: Vec<(&str, Vec<u32>)> = Vec::new();
        for (s, f) in wanted {
            for n in [*s, *f] {
                if !names.iter().any(|(m, _)| *m == n) {
                    names.push((n, Vec::new()));
                }
            }
        }
        // The string section, a NUL-terminated string after another.
        r.seek(SeekFrom::Start(hdr_len + str_off))
            .map_err(cut_short)?;
        let mut strings = (&mut r).take(str_len);
        let (mut at, mut s) = (0u64, Vec::new());
        while at < str_len {
            s.clear();
            let n = strings.read_until(0, &mut s).map_err(cut_short)?;
            if n == 0 {
                return Err(BtfError::Format("string section out of bounds"));
            }
            let text = s.strip_suffix(&[0]).unwrap_or(&s);
            if let Some((_, offs)) = names.iter_mut().find(|(m, _)| m.as_bytes() == text) {
                offs.push(u32::try_from(at).map_err(|_| BtfError::Format("too large"))?);
            }
            at += n as u64;
        }
        // The type records.
        let types = hdr_len + type_off;
        r.seek(SeekFrom::Start(types)).map_err(cut_short)?;
        let mut btf = Self {
            r,
            types,
            at: Vec::new(),
            names,
            structs: Vec::new(),
        };
        let mut off = 0u64;
        while off < type_len {
            let t = btf.record_here()?;
            let extra = u64::from(match t.kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => t.vlen * 12,
                KIND_ENUM | KIND_FUNC_PROTO => t.vlen * 8,
                2 | 7 | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | 12 | 16
                | KIND_TYPE_TAG => 0,
                k => return Err(BtfError::UnknownKind(k)),
            });
            btf.at
                .push(u32::try_from(off).map_err(|_| BtfError::Format("too large"))?);
            if t.kind == KIND_STRUCT && t.name != 0 {
                let id = btf.at.len() as u32;
                for (name, offs) in &btf.names {
                    if offs.contains(&t.name)
                        && wanted.iter().any(|(s, _)| s == name)
                        && !btf.structs.iter().any(|(n, _)| n == name)
                    {
                        btf.structs.push((name, id));
                    }
                }
            }
            off += 12 + extra;
            if off > type_len {
                return Err(BtfError::Format("type section out of bounds"));
            }
            btf.r.seek_relative(extra as i64).map_err(cut_short)?;
        }
        Ok(btf)
    }

    /// Where `name`, one of the names asked for, is in the string section.
    fn offsets_of(&self, name: &str) -> &[u32] {
        self.names
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(&[], |(_, offs)| offs.as_slice())
    }

    /// The record at the reader's position.
    fn record_here(&mut self) -> Result<Type, BtfError> {
        let mut b = [0u8; 12];
        self.r.read_exact(&mut b).map_err(cut_short)?;
        let info = word(&b, 1);
        Ok(Type {
            name: word(&b, 0),
            kind: (info >> 24) & 0x1F,
            vlen: info & 0xFFFF,
            kind_flag: info >> 31 == 1,
            ty: word(&b, 2),
        })
    }

    /// Type `id`, the reader left at its trailing data (`None`: `void` or out of range).
    fn get(&mut self, id: u32) -> Result<Option<Type>, BtfError> {
        let Some(&off) = (id as usize).checked_sub(1).and_then(|i| self.at.get(i)) else {
            return Ok(None);
        };
        self.r
            .seek(SeekFrom::Start(self.types + u64::from(off)))
            .map_err(cut_short)?;
        self.record_here().map(Some)
    }

    /// Follows typedefs and modifiers to the underlying type id.
    fn resolve(&mut self, mut id: u32) -> Result<u32, BtfError> {
        for _ in 0..32 {
            match self.get(id)? {
                Some(t)
                    if matches!(
                        t.kind,
                        KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG
                    ) =>
                {
                    id = t.ty
                }
                _ => break,
            }
        }
        Ok(id)
    }

    /// The bit offset of `field` in the struct or union `id`, looking inside anonymous
    /// members.
    fn member_bits(&mut self, id: u32, field: &str, depth: u32) -> Result<Option<u32>, BtfError> {
        let id = self.resolve(id)?;
        let Some(t) = self.get(id)? else {
            return Ok(None);
        };
        if depth > 8 || !matches!(t.kind, KIND_STRUCT | KIND_UNION) {
            return Ok(None);
        }
        let mut members = vec![0u8; t.vlen as usize * 12];
        self.r.read_exact(&mut members).map_err(cut_short)?;
        let names = self.offsets_of(field).to_vec();
        for m in members.chunks_exact(12) {
            let (name, ty, raw) = (word(m, 0), word(m, 1), word(m, 2));
            let bit_offset = if t.kind_flag { raw & 0xFF_FFFF } else { raw };
            if name == 0 {
                if let Some(inner) = self.member_bits(ty, field, depth + 1)? {
                    return Ok(Some(bit_offset + inner));
                }
            } else if names.contains(&name) {
                return Ok(Some(bit_offset));
            }
        }
        Ok(None)
    }

    /// The byte offset of `strukt.field`.
    fn offset(&mut self, strukt: &str, field: &str) -> Result<u32, BtfError> {
        let id = self
            .structs
            .iter()
            .find(|(n, _)| *n == strukt)
            .map(|(_, id)| *id)
            .ok_or_else(|| BtfError::Missing(format!("struct {strukt}")))?;
        let bits = self
            .member_bits(id, field, 0)?
            .ok_or_else(|| BtfError::Missing(format!("{strukt}.{field}")))?;
        if bits % 8 != 0 {
            return Err(BtfError::Missing(format!("{strukt}.{field} (a bitfield)")));
        }
        Ok(bits / 8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A blob with `struct inner { int a; union { int b; int i_rdev; }; }` and
    /// `struct inode { int x; int y; struct inner in; }` built by hand.
    fn blob() -> Vec<u8> {
        let strings = b"\0int\0a\0b\0i_rdev\0inner\0inode\0x\0y\0in\0".to_vec();
        let s = |name: &str| {
            let pos = strings
                .windows(name.len() + 2)
                .position(|w| {
                    w[0] == 0 && &w[1..=name.len()] == name.as_bytes() && w[name.len() + 1] == 0
                })
                .expect("string");
            (pos + 1) as u32
        };
        let mut t = Vec::new();
        let mut push = |words: &[u32]| {
            for w in words {
                t.extend_from_slice(&w.to_le_bytes());
            }
        };
        // 1: int (INT, size 4, encoding word).
        push(&[s("int"), KIND_INT << 24, 4, 32]);
        // 2: anonymous union { int b @0; int i_rdev @0 }.
        push(&[
            0,
            (KIND_UNION << 24) | 2,
            4,
            s("b"),
            1,
            0,
            s("i_rdev"),
            1,
            0,
        ]);
        // 3: struct inner { int a @0; <anon union> @32 bits }.
        push(&[
            s("inner"),
            (KIND_STRUCT << 24) | 2,
            8,
            s("a"),
            1,
            0,
            0,
            2,
            32,
        ]);
        // 4: const struct inner (a modifier to follow).
        push(&[0, KIND_CONST << 24, 3]);
        // 5: struct inode { int x @0; int y @32; const struct inner in @64 }.
        push(&[
            s("inode"),
            (KIND_STRUCT << 24) | 3,
            16,
            s("x"),
            1,
            0,
            s("y"),
            1,
            32,
            s("in"),
            4,
            64,
        ]);
        let mut b = Vec::new();
        b.extend_from_slice(&[0x9F, 0xEB, 1, 0]);
        for w in [
            24u32,
            0,
            t.len() as u32,
            t.len() as u32,
            strings.len() as u32,
        ] {
            b.extend_from_slice(&w.to_le_bytes());
        }
        b.extend_from_slice(&t);
        b.extend_from_slice(&strings);
        b
    }

    fn read<const N: usize>(b: &[u8], wanted: &[(&str, &str); N]) -> Result<[u32; N], BtfError> {
        field_offsets(std::io::Cursor::new(b), wanted)
    }

    #[test]
    fn offsets_through_anonymous_members() {
        let b = blob();
        let got = read(&b, &[("inner", "a"), ("inner", "i_rdev"), ("inode", "y")]);
        assert_eq!(got.ok(), Some([0, 4, 4]));
        assert!(matches!(
            read(&b, &[("inode", "zz")]),
            Err(BtfError::Missing(m)) if m == "inode.zz"
        ));
        assert!(matches!(
            read(&b, &[("file", "f_inode")]),
            Err(BtfError::Missing(m)) if m == "struct file"
        ));
        // A field of another struct is not this one's.
        assert!(matches!(
            read(&b, &[("inner", "x")]),
            Err(BtfError::Missing(m)) if m == "inner.x"
        ));
    }

    #[test]
    fn garbage_and_every_cut_are_errors() {
        assert!(matches!(
            read(b"hello world, not btf at all", &[("inode", "y")]),
            Err(BtfError::Format(_))
        ));
        let b = blob();
        for n in 0..b.len() {
            assert!(
                read(&b[..n], &[("inode", "y")]).is_err(),
                "cut at {n} of {}",
                b.len()
            );
        }
    }

    #[test]
    fn this_kernel() {
        // Where the kernel has BTF: the offsets are sane (non-zero where they cannot be 0;
        // `struct fdtable` has begun `unsigned int max_fds; struct file __rcu **fd;` since
        // Linux 2.6.14).
        let Ok(file) = std::fs::File::open("/sys/kernel/btf/vmlinux") else {
            assert!(
                std::env::var_os("CI").is_none(),
                "no /sys/kernel/btf/vmlinux (CI runs the eBPF tests, which need it)"
            );
            eprintln!("SKIPPED: no /sys/kernel/btf/vmlinux");
            return;
        };
        let o = offsets(file).expect("offsets");
        assert_eq!((o.fdt_max_fds, o.fdt_fd), (0, 8), "{o:?}");
        assert!(
            o.task_files > 0 && o.file_inode > 0 && o.inode_rdev > 0,
            "{o:?}"
        );
        assert_eq!(o.valid, 1);
    }
}
