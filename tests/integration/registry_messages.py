"""For the schema registry tests: a Protobuf message class built from a descriptor (no
protoc), ``registry_messages:Order``; and ``registry_messages:Discard``, a processor
``kasper run`` can take, that decodes its input and keeps nothing."""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from kasper_py import Message, MessageProcessor, ProcessorContext, Sender

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


class Discard(MessageProcessor):
    """Takes its (decoded) input and does nothing with it: the turn is decode and commit."""

    def __init__(self, context: ProcessorContext) -> None:
        self.partition = context.partition

    def process(self, messages: list[Message], sender: Sender) -> None:
        pass
