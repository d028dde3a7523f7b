//! Kernel struct offsets from BTF (`/sys/kernel/btf/vmlinux`).
//!
//! Rust BPF programs get no CO-RE relocations, so the offsets of the fields the programs walk
//! (`task_struct.files`, `files_struct.fdt`, `fdtable.{max_fds,fd}`, `file.f_inode`,
//! `inode.i_rdev`) are read from the running kernel's BTF at start-up and passed in as a
//! global. Only what that needs is parsed: the header, the string section, and the type
//! records (each kind's trailing data is skipped by its documented size,
//! `Documentation/bpf/btf.rst`). Anonymous struct and union members are searched through.

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

/// A type record's leading words.
struct Type {
    name: u32,
    kind: u32,
    /// Member count (struct, union).
    vlen: usize,
    kind_flag: bool,
    /// The referenced type (typedef, modifiers).
    ty: u32,
    /// Where its trailing data (the members) starts in the type section.
    data: usize,
}

/// The parsed type section: the blob itself, with where each type's record starts. Nothing
/// is copied (vmlinux's BTF is about 5 MB and 130,000 types; a table of every type's members
/// and names was three times the blob).
pub struct Btf<'a> {
    strings: &'a [u8],
    types: &'a [u8],
    /// Index = type id - 1 (0 is `void`): the record's offset in `types`.
    at: Vec<u32>,
}

fn u32_at(b: &[u8], off: usize) -> Result<u32, BtfError> {
    b.get(off..off + 4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or(BtfError::Format("truncated"))
}

impl<'a> Btf<'a> {
    /// Parses a little-endian BTF blob.
    pub fn parse(b: &'a [u8]) -> Result<Self, BtfError> {
        if b.len() < 24 || b[0..2] != [0x9F, 0xEB] {
            return Err(BtfError::Format("bad magic (big-endian or not BTF)"));
        }
        let hdr_len = u32_at(b, 4)? as usize;
        let (type_off, type_len) = (u32_at(b, 8)? as usize, u32_at(b, 12)? as usize);
        let (str_off, str_len) = (u32_at(b, 16)? as usize, u32_at(b, 20)? as usize);
        let types = b
            .get(hdr_len + type_off..hdr_len + type_off + type_len)
            .ok_or(BtfError::Format("type section out of bounds"))?;
        let strings = b
            .get(hdr_len + str_off..hdr_len + str_off + str_len)
            .ok_or(BtfError::Format("string section out of bounds"))?;
        let mut at = Vec::new();
        let mut off = 0;
        while off < types.len() {
            let record = u32::try_from(off).map_err(|_| BtfError::Format("too large"))?;
            let t = Self::record(types, off)?;
            let extra = match t.kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => t.vlen * 12,
                KIND_ENUM | KIND_FUNC_PROTO => t.vlen * 8,
                2 | 7 | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | 12 | 16
                | KIND_TYPE_TAG => 0,
                k => return Err(BtfError::UnknownKind(k)),
            };
            off = t.data + extra;
            if off > types.len() {
                return Err(BtfError::Format("truncated"));
            }
            at.push(record);
        }
        Ok(Self { strings, types, at })
    }

    /// The record at `off` in the type section.
    fn record(types: &[u8], off: usize) -> Result<Type, BtfError> {
        let info = u32_at(types, off + 4)?;
        Ok(Type {
            name: u32_at(types, off)?,
            kind: (info >> 24) & 0x1F,
            vlen: (info & 0xFFFF) as usize,
            kind_flag: info >> 31 == 1,
            ty: u32_at(types, off + 8)?,
            data: off + 12,
        })
    }

    /// Type `id` (`None`: `void` or out of range).
    fn get(&self, id: u32) -> Option<Type> {
        let off = *self.at.get((id as usize).checked_sub(1)?)?;
        Self::record(self.types, off as usize).ok()
    }

    fn name(&self, off: u32) -> &'a str {
        let rest = self.strings.get(off as usize..).unwrap_or_default();
        let end = rest.iter().position(|&c| c == 0).unwrap_or(rest.len());
        std::str::from_utf8(&rest[..end]).unwrap_or("")
    }

    /// The first complete definition of `struct name` (a forward declaration has kind FWD).
    fn find_struct(&self, name: &str) -> Option<u32> {
        (1..=self.at.len() as u32).find(|&id| {
            self.get(id)
                .is_some_and(|t| t.kind == KIND_STRUCT && t.name != 0 && self.name(t.name) == name)
        })
    }

    /// Follows typedefs and modifiers to the underlying type id.
    fn resolve(&self, mut id: u32) -> u32 {
        for _ in 0..32 {
            match self.get(id) {
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
        id
    }

    /// The bit offset of `field` in the struct or union `id`, looking inside anonymous
    /// members.
    fn member_bits(&self, id: u32, field: &str, depth: u32) -> Option<u32> {
        let t = self.get(self.resolve(id))?;
        if depth > 8 || !matches!(t.kind, KIND_STRUCT | KIND_UNION) {
            return None;
        }
        for i in 0..t.vlen {
            let m = t.data + i * 12;
            let (name, ty, raw) = (
                u32_at(self.types, m).ok()?,
                u32_at(self.types, m + 4).ok()?,
                u32_at(self.types, m + 8).ok()?,
            );
            let bit_offset = if t.kind_flag { raw & 0xFF_FFFF } else { raw };
            if name == 0 {
                if let Some(inner) = self.member_bits(ty, field, depth + 1) {
                    return Some(bit_offset + inner);
                }
            } else if self.name(name) == field {
                return Some(bit_offset);
            }
        }
        None
    }

    /// The byte offset of `strukt.field`.
    pub fn offset(&self, strukt: &str, field: &str) -> Result<u32, BtfError> {
        let id = self
            .find_struct(strukt)
            .ok_or_else(|| BtfError::Missing(format!("struct {strukt}")))?;
        let bits = self
            .member_bits(id, field, 0)
            .ok_or_else(|| BtfError::Missing(format!("{strukt}.{field}")))?;
        if bits % 8 != 0 {
            return Err(BtfError::Missing(format!("{strukt}.{field} (a bitfield)")));
        }
        Ok(bits / 8)
    }

    /// The offsets the programs need.
    pub fn offsets(&self) -> Result<Offsets, BtfError> {
        Ok(Offsets {
            task_files: self.offset("task_struct", "files")?,
            files_fdt: self.offset("files_struct", "fdt")?,
            fdt_max_fds: self.offset("fdtable", "max_fds")?,
            fdt_fd: self.offset("fdtable", "fd")?,
            file_inode: self.offset("file", "f_inode")?,
            inode_rdev: self.offset("inode", "i_rdev")?,
            task_group_leader: self.offset("task_struct", "group_leader")?,
            task_comm: self.offset("task_struct", "comm")?,
            exit_group_dead: 0,
            valid: 1,
        })
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

    #[test]
    fn offsets_through_anonymous_members() {
        let b = blob();
        let btf = Btf::parse(&b).expect("parse");
        assert_eq!(btf.offset("inner", "a").ok(), Some(0));
        assert_eq!(btf.offset("inner", "i_rdev").ok(), Some(4));
        assert_eq!(btf.offset("inode", "y").ok(), Some(4));
        assert!(matches!(
            btf.offset("inode", "zz"),
            Err(BtfError::Missing(_))
        ));
        assert!(matches!(
            btf.offset("file", "f_inode"),
            Err(BtfError::Missing(_))
        ));
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(Btf::parse(b"hello world, not btf at all").is_err());
        let mut b = blob();
        b.truncate(40);
        assert!(Btf::parse(&b).is_err());
    }

    #[test]
    fn this_kernel() {
        // Where the kernel has BTF: the offsets are sane (non-zero where they cannot be 0).
        let Ok(bytes) = std::fs::read("/sys/kernel/btf/vmlinux") else {
            assert!(
                std::env::var_os("CI").is_none(),
                "no /sys/kernel/btf/vmlinux (CI runs the eBPF tests, which need it)"
            );
            eprintln!("SKIPPED: no /sys/kernel/btf/vmlinux");
            return;
        };
        let o = Btf::parse(&bytes)
            .and_then(|b| b.offsets())
            .expect("offsets");
        assert!(
            o.task_files > 0 && o.file_inode > 0 && o.inode_rdev > 0,
            "{o:?}"
        );
        assert_eq!(o.valid, 1);
    }
}
