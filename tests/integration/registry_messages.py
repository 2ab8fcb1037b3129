"""A Protobuf message class for the schema registry tests, built from a descriptor (no
protoc): ``registry_messages:Order``."""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_FIELD = descriptor_pb2.FieldDescriptorProto


def _order_file() -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(name="kasper_tests/order.proto",
                                              package="kasper.tests", syntax="proto3")
    order = file.message_type.add(name="Order")
    order.field.add(name="id", number=1, type=_FIELD.TYPE_STRING, label=_FIELD.LABEL_OPTIONAL)
    order.field.add(name="amount", number=2, type=_FIELD.TYPE_INT64,
                    label=_FIELD.LABEL_OPTIONAL)
    return file


_pool = descriptor_pool.DescriptorPool()
_pool.Add(_order_file())
Order = message_factory.GetMessageClass(_pool.FindMessageTypeByName("kasper.tests.Order"))
