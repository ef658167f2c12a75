from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class VersionRequest(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: str
    def __init__(self, version: _Optional[str] = ...) -> None: ...

class VersionResponse(_message.Message):
    __slots__ = ("version", "runtime_name", "runtime_version")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_NAME_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_VERSION_FIELD_NUMBER: _ClassVar[int]
    version: str
    runtime_name: str
    runtime_version: str
    def __init__(self, version: _Optional[str] = ..., runtime_name: _Optional[str] = ..., runtime_version: _Optional[str] = ...) -> None: ...

class MountRequest(_message.Message):
    __slots__ = ("attributes", "secrets", "target_path", "permission", "current_object_version")
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    SECRETS_FIELD_NUMBER: _ClassVar[int]
    TARGET_PATH_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    CURRENT_OBJECT_VERSION_FIELD_NUMBER: _ClassVar[int]
    attributes: str
    secrets: str
    target_path: str
    permission: str
    current_object_version: _containers.RepeatedCompositeFieldContainer[ObjectVersion]
    def __init__(self, attributes: _Optional[str] = ..., secrets: _Optional[str] = ..., target_path: _Optional[str] = ..., permission: _Optional[str] = ..., current_object_version: _Optional[_Iterable[_Union[ObjectVersion, _Mapping]]] = ...) -> None: ...

class MountResponse(_message.Message):
    __slots__ = ("object_version", "error", "files")
    OBJECT_VERSION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    object_version: _containers.RepeatedCompositeFieldContainer[ObjectVersion]
    error: Error
    files: _containers.RepeatedCompositeFieldContainer[File]
    def __init__(self, object_version: _Optional[_Iterable[_Union[ObjectVersion, _Mapping]]] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., files: _Optional[_Iterable[_Union[File, _Mapping]]] = ...) -> None: ...

class File(_message.Message):
    __slots__ = ("path", "mode", "contents")
    PATH_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    CONTENTS_FIELD_NUMBER: _ClassVar[int]
    path: str
    mode: int
    contents: bytes
    def __init__(self, path: _Optional[str] = ..., mode: _Optional[int] = ..., contents: _Optional[bytes] = ...) -> None: ...

class ObjectVersion(_message.Message):
    __slots__ = ("id", "version")
    ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    id: str
    version: str
    def __init__(self, id: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("code",)
    CODE_FIELD_NUMBER: _ClassVar[int]
    code: str
    def __init__(self, code: _Optional[str] = ...) -> None: ...
